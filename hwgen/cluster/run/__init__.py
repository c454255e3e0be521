"""Running clusters (top layer): the builder (Verilog per FPGA), the multi-FPGA lock-step
simulation over the network model, the encoder simulation and the benches."""
