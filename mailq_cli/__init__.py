"""The `mailq` console script, above both the runtime and the pipeline: `main` parses and dispatches, one
module per group of subcommands. The runtime's (`queue_commands`, `dead_letter_commands`,
`worker_command`, `config_commands`) import only `mailq_runtime`; the pipeline's (`pipeline_commands`,
`demo_command`) import `assets` too, and are imported only when one of them is named."""
