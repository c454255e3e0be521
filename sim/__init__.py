"""cocotb testbenches, installed as ``hwgen.sim`` (``pyproject.toml`` maps this folder there).

cocotb imports them by module name, e.g. ``hwgen.sim.stream_tb`` (see
:func:`hwgen.flow.verilator.run_testbench`); there is no top-level ``sim`` package.
"""
