"""The context pool: one context per device, its fair queue, batches and continuous rows."""
