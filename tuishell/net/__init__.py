"""Network egress for sandboxed commands (the proxy arrives with the network issue)."""
