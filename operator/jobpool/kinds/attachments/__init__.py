"""Attachments: committing an upload (`jobpool.commit_upload`) enqueues its virus_scan, which
streams the file to clamd and records the verdict."""
