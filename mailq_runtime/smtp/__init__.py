"""`mailq smtp`: an ESMTP server (aiosmtpd) that accepts mail into a queue, answering 250 only once the
mail's enqueue returned, at the store's durability. Local users are those with a mailbox; relaying to
other domains is for the configured networks and for clients authenticated over TLS.

The `mailq smtp` command (mailq_cli/smtp_command.py) imports its modules once it runs: the other commands
start without aiosmtpd."""
