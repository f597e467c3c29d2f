"""Field recording on the device, for an audit against training (``verify --bundle B --audit DIR``).

``Recorder`` (``recorder``; its writer thread, directory lock and exit handling in ``sink``) keeps every step a
deployed policy takes; ``inference.load(BUNDLE, record=DIR)`` and ``play --record DIR`` use it. The chunks' format
and their reading are the bundle room's (``inference.bundle.recording``), re-exported here.
"""

from inference.field.recorder import (
    DEFAULT_CHUNK_STEPS,
    Recorder,
    Recording,
    read_recording,
    recording_chunks,
    write_chunk,
)

__all__ = ["DEFAULT_CHUNK_STEPS", "Recorder", "Recording", "read_recording", "recording_chunks", "write_chunk"]
