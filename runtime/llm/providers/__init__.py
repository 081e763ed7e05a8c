"""Provider adapters behind the port: each turns a ``Request`` into its wire format over httpx."""
