"""Stream beats and the testbenches' frames, both ways: what both simulation engines and the
cluster's lock-step runs exchange with a testbench. A frame is a list of packed TDATA words
(or ``{"tdata": word, "tkeep": ..., ...}`` dicts for streams with sideband signals), ending at
TLAST."""

from .ports import SIDEBANDS

__all__ = ["stimulus_frames", "received_beats"]


def stimulus_frames(beats, fmt):
    """Group packed words into AXI-Stream frames at beats with ``last`` set. A beat of a
    stream with sideband fields is ``{"tdata": word, "tkeep": ..., "tdest": ...}``."""
    words = [fmt.pack(b) for b in beats]
    if fmt.sidebands:
        words = [{"tdata": w, **fmt.pack_sidebands(b)} for w, b in zip(words, beats)]
    if not fmt.has_last:
        return [words] if words else []
    frames, current = [], []
    for beat, word in zip(beats, words):
        current.append(word)
        if beat["last"]:
            frames.append(current)
            current = []
    if current:
        raise ValueError("stimulus stream does not end with a beat whose last flag is set")
    return frames


def received_beats(frames, fmt):
    """Unpack the testbench's frames; TLAST (end of each frame) becomes the ``last`` field."""
    beats = []
    inverse = {signal: name for name, signal in SIDEBANDS.items()}
    for frame in frames:
        for k, word in enumerate(frame):
            if isinstance(word, dict):          # a beat with sideband signals
                beat = fmt.unpack(word["tdata"])
                beat.update({inverse[sig]: v for sig, v in word.items() if sig != "tdata"})
            else:
                beat = fmt.unpack(word)
            if fmt.has_last:
                beat["last"] = int(k == len(frame) - 1)
            beats.append(beat)
    return beats
