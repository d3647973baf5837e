"""The pytest fixtures over the server harness (the `mailq_servers` package) and the harness's own tests."""
