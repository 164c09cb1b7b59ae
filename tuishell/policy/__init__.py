"""Security policy: every rule about paths, domains and environment is decided here, once."""
