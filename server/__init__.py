"""The asyncio shell around `pipeline`: WebSocket and HTTP on one port, one inference worker."""
