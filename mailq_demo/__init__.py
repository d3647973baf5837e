"""The generated traffic of `mailq demo`: mail through the queue (`traffic`), then the mailboxes it fills
used a little (`mailboxes`). It builds on the runtime's public API and is no part of it; `mailq_cli.demo`
runs it, then the maintenance pipeline."""
