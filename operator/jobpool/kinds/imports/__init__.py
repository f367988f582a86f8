"""Bulk import: stage a CSV or JSON Lines file (`jobpool import`), then the bulk_import kind
validates its records against the entity type's attributes and commits them in batches."""
