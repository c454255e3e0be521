"""Old entry points kept after the host code moved into its domain packages
(``hwgen.vecsearch.host``, ``hwgen.espn.host``, ``hwgen.windve``, ``hwgen.ralm``):
``python -m hwgen.host.node_server`` still starts the ChamVS node server."""
