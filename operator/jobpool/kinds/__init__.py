"""Built-in job kinds, one folder per feature: its pure part, its I/O, its SQL, its kind(s).

email/ (email_send), imports/ (bulk_import and `jobpool import`), indexes/ (reindex,
index_sync, gin_backfill), webhooks/ (the outbox and outbox_dispatch), attachments/ (uploads
and virus_scan), and entities/, the entity types and attributes that imports and indexes
share. The kinds register through the `jobpool.kinds` entry points, loaded when a worker
starts; no package here imports a package of an extra when it is imported.
"""
