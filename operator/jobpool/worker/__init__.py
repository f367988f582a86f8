"""The asyncio worker: fetch loop, slots, executor, leases, listener, maintenance."""
