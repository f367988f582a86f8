"""Webhooks: outbox events published in the service's transaction (`jobpool.publish_event`),
delivered by outbox_dispatch as signed HTTP POSTs to the tenant's subscribers."""
