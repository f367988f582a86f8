"""Kubernetes: pure manifest builders and reconcile plan, the API client, kopf wiring."""
