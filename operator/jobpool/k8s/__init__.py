"""Kubernetes: pure manifest builders, reconcile plan, status and Lease rules; the API client
(lightkube), leader election and the kopf wiring."""
