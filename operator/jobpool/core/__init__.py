"""Pure decisions: no database, no Kubernetes, no event loop."""
