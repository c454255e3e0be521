"""Built-in self-test wrapper: a stream core checked on an FPGA board with no host attached.

The simulation's stimulus (the input beats of every input stream) and the golden model's
results (the expected beats of every output stream) are stored in on-chip ROMs beside the core.
After reset the wrapper streams the stimulus into the core, compares every output beat with the
next expected beat, and reports on two status bits: ``done`` when every stream has seen all its
beats, ``fail`` as soon as a beat differs (or a stream delivers more beats than expected).

Each ROM is a block-RAM read port whose address runs one beat ahead, so the beat in front of the
core or the comparator is always registered memory data; a stream moves one beat per cycle.
The output streams are always ready; input gaps and output backpressure are exercised in
simulation (``hwgen sim --stall``), not here.
"""

from amaranth.hdl import Const, Module, Shape, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import Out

__all__ = ["SelfTest", "rom_words"]


def rom_words(layout, beats):
    """Beats (dicts of field values, as the stream models give them) packed as ``layout`` bits."""
    layout = data.Layout.cast(layout)
    return [layout.const(beat).as_bits() for beat in beats]


class _RomStream:
    """Sequencing of one ROM: ``index`` of the beat presented, ``word`` its registered data."""

    def __init__(self, m, name, layout, words):
        width = Shape.cast(layout).width
        self.count = len(words)
        self.index = Signal(range(self.count + 1), name=f"{name}_index")
        self.advance = Signal(name=f"{name}_advance")
        rom = memory.Memory(shape=width, depth=max(self.count, 1), init=words or [0])
        m.submodules[f"{name}_rom"] = rom
        port = rom.read_port()
        self.primed = Signal(name=f"{name}_primed")
        m.d.sync += self.primed.eq(1)
        nxt = Signal.like(self.index, name=f"{name}_next")
        m.d.comb += [nxt.eq(self.index + self.advance), port.addr.eq(nxt)]
        m.d.sync += self.index.eq(nxt)
        self.word = port.data
        self.pending = self.primed & (self.index < self.count)


class SelfTest(wiring.Component):
    """A stream core between stimulus ROMs and result comparators.

    Parameters
    ----------
    core : wiring.Component
        The stream core (the component ``hwgen build`` wraps in its AXI-Stream top).
    inputs, expected : dict
        ``{member name: [beat, ...]}`` of the core's input and output streams, as a registered
        accelerator's stream model gives them (``Model.inputs`` and ``Model.expect``).

    Members
    -------
    done : ``Out(1)``
        Every input beat was accepted and every output stream delivered all its beats.
    fail : ``Out(1)``
        Sticky: an output beat differed from the expected one, or came in excess.
    """

    done: Out(1)
    fail: Out(1)

    def __init__(self, core, inputs, expected):
        self._core = core
        self._inputs = inputs
        self._expected = expected
        for name in list(inputs) + list(expected):
            if name not in core.signature.members:
                raise ValueError(f"the core has no stream {name!r}")
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self._core
        finished = []
        for name, beats in self._inputs.items():
            port = getattr(core, name)
            rom = _RomStream(m, name, port.payload.shape(), rom_words(port.payload.shape(),
                                                                       beats))
            m.d.comb += [port.valid.eq(rom.pending), port.payload.eq(rom.word),
                         rom.advance.eq(port.valid & port.ready)]
            finished.append(rom.index == rom.count)
        for name, beats in self._expected.items():
            port = getattr(core, name)
            rom = _RomStream(m, name, port.payload.shape(), rom_words(port.payload.shape(),
                                                                       beats))
            take = Signal(name=f"{name}_take")
            m.d.comb += [port.ready.eq(1), take.eq(port.valid), rom.advance.eq(take & rom.pending)]
            with m.If(take & (~rom.pending | (port.payload.as_value() != rom.word))):
                m.d.sync += self.fail.eq(1)
            finished.append(rom.index == rom.count)
        # Output streams the model does not check are drained (inputs it leaves out stay idle).
        for name, member in core.signature.members.items():
            if member.is_signature and member.flow == Out and name not in self._expected \
                    and "ready" in member.signature.members:
                m.d.comb += getattr(core, name).ready.eq(1)
        done = Const(1)
        for f in finished:
            done = done & f
        m.d.sync += self.done.eq(done)
        return m
