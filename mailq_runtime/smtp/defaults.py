"""The server's defaults, apart from the modules that load aiosmtpd, so that the `mailq` command lists them
without loading it."""

# Postfix's `mynetworks_style = host`: only the machine itself relays without authenticating.
DEFAULT_NETWORKS = ("127.0.0.1/32", "::1/128")
# RFC 5321 4.5.3.2.7: the server waits at least five minutes for a command; the DATA termination's ten.
COMMAND_TIMEOUT = 300.0
DATA_TERMINATION_TIMEOUT = 600.0
