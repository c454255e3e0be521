"""Host-side code that has not moved into its domain package yet: the ESPN pipeline
(``hwgen.host.espn``), and the old entry point ``python -m hwgen.host.node_server``."""
