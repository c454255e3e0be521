"""The reference design that ``hwgen timing`` places and routes beside every block.

A block's post-route Fmax alone says little: it moves with the tool version, the seed and the
machine. hwgen reports it as a ratio to this design, placed and routed in the same run with the
same tools and seeds, so those effects cancel. The reference holds the two fastest primitives
an accelerator datapath is built from, each used the way a fully pipelined design uses it:

* a signed 18x18 multiply-accumulate with registered inputs, a registered product and a
  registered 48-bit accumulator (one ECP5 ``MULT18X18D`` / one DSP48E2 with A/B/M/P registers);
* a 1024 x 18 block-RAM read whose data goes straight into a register (one ``DP16KD``; the
  read data pass through no logic before the register).

Its Fmax is the slower of the two paths: the clock a block can reach when nothing but its
primitives limit it.
"""

from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["TimingReference"]


class TimingReference(wiring.Component):
    """Registered 18x18 MAC and a registered block-RAM read (see the module docstring).

    Members
    -------
    a, b : ``In(signed(18))``
        Multiplier operands, registered on entry.
    acc : ``Out(signed(48))``
        Running sum of the products; latency 3 cycles (input, product, accumulator registers).
    waddr, raddr : ``In(10)``; wdata : ``In(18)``; we : ``In(1)``
        Write and read ports of the 1024 x 18 memory.
    rdata : ``Out(18)``
        Read data, registered once more after the memory's synchronous read (latency 2).
    """

    a: In(signed(18))
    b: In(signed(18))
    acc: Out(signed(48))
    waddr: In(10)
    raddr: In(10)
    wdata: In(18)
    we: In(1)
    rdata: Out(18)

    def elaborate(self, platform):
        m = Module()
        ra, rb = Signal(signed(18)), Signal(signed(18))
        product = Signal(signed(36))
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), product.eq(ra * rb),
                     self.acc.eq(self.acc + product)]

        m.submodules.mem = mem = memory.Memory(shape=unsigned(18), depth=1024, init=[])
        wr, rd = mem.write_port(), mem.read_port()
        m.d.comb += [wr.addr.eq(self.waddr), wr.data.eq(self.wdata), wr.en.eq(self.we),
                     rd.addr.eq(self.raddr)]
        m.d.sync += self.rdata.eq(rd.data)
        return m
