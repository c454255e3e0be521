// Behavioural model of the ECP5 MULT18X18D, for the subset hwgen.flow.ecp5_dsp_pack uses:
// A[17:0] x B[17:0] -> P[35:0], signed or unsigned per SIGNEDA/SIGNEDB, with optional input
// registers (REG_INPUTA_CLK, REG_INPUTB_CLK) and output register (REG_OUTPUT_CLK), each "NONE"
// or "CLK0", enabled by the CE port its REG_*_CE names and cleared by the RST port its
// REG_*_RST names (RESETMODE "SYNC": reset wins over the enable). The pipeline register,
// the shift-out chains (SRIA/SRIB/SROA/SROB), SOURCEA/SOURCEB and the cascade outputs are not
// modelled: the packing never sets them. Registers power up to 0. Written for the packing
// test's equivalence check (tests/test_ecp5_dsp_pack.py); not a vendor model.
module MULT18X18D (
    input A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0,
    input B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0,
    input C17, C16, C15, C14, C13, C12, C11, C10, C9, C8, C7, C6, C5, C4, C3, C2, C1, C0,
    input SIGNEDA, SIGNEDB, SOURCEA, SOURCEB,
    input CLK0, CLK1, CLK2, CLK3, CE0, CE1, CE2, CE3, RST0, RST1, RST2, RST3,
    output P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20,
    output P19, P18, P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3, P2,
    output P1, P0
);
    parameter REG_INPUTA_CLK = "NONE";
    parameter REG_INPUTA_CE = "CE0";
    parameter REG_INPUTA_RST = "RST0";
    parameter REG_INPUTB_CLK = "NONE";
    parameter REG_INPUTB_CE = "CE0";
    parameter REG_INPUTB_RST = "RST0";
    parameter REG_OUTPUT_CLK = "NONE";
    parameter REG_OUTPUT_CE = "CE0";
    parameter REG_OUTPUT_RST = "RST0";
    parameter RESETMODE = "SYNC";
    parameter GSR = "DISABLED";

    wire [17:0] a = {A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0};
    wire [17:0] b = {B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0};
    wire [3:0] ce = {CE3, CE2, CE1, CE0};
    wire [3:0] rst = {RST3, RST2, RST1, RST0};

    function integer port_index(input [8*4-1:0] name);
        port_index = name[7:0] - "0";
    endfunction

    reg [17:0] a_q = 18'd0, b_q = 18'd0;
    reg sa_q = 1'b0, sb_q = 1'b0;
    always @(posedge CLK0) begin
        if (rst[port_index(REG_INPUTA_RST)]) begin a_q <= 18'd0; sa_q <= 1'b0; end
        else if (ce[port_index(REG_INPUTA_CE)]) begin a_q <= a; sa_q <= SIGNEDA; end
        if (rst[port_index(REG_INPUTB_RST)]) begin b_q <= 18'd0; sb_q <= 1'b0; end
        else if (ce[port_index(REG_INPUTB_CE)]) begin b_q <= b; sb_q <= SIGNEDB; end
    end
    wire [17:0] a_m = REG_INPUTA_CLK == "NONE" ? a : a_q;
    wire [17:0] b_m = REG_INPUTB_CLK == "NONE" ? b : b_q;
    wire sa = REG_INPUTA_CLK == "NONE" ? SIGNEDA : sa_q;
    wire sb = REG_INPUTB_CLK == "NONE" ? SIGNEDB : sb_q;
    wire [35:0] a_x = {{18{sa & a_m[17]}}, a_m};
    wire [35:0] b_x = {{18{sb & b_m[17]}}, b_m};
    wire [35:0] p = a_x * b_x;

    reg [35:0] p_q = 36'd0;
    always @(posedge CLK0)
        if (rst[port_index(REG_OUTPUT_RST)]) p_q <= 36'd0;
        else if (ce[port_index(REG_OUTPUT_CE)]) p_q <= p;
    wire [35:0] p_o = REG_OUTPUT_CLK == "NONE" ? p : p_q;
    assign {P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20,
            P19, P18, P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3, P2,
            P1, P0} = p_o;
endmodule
