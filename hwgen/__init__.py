"""hwgen: a hardware generator for data-centre ML accelerators.

A validated Python config becomes an Amaranth component, Verilog for an AMD Alveo or Versal
board, a Verilator simulation proving the Verilog equal to a numpy golden model, a yosys
resource estimate, and Vitis/Vivado files. See README.md and the documentation site in docs/.
"""

__version__ = "0.1.0"
