"""The admin REST API."""
