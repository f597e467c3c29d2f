"""The field recorder on its own (no runtime, no env): what a control loop hands it reaches the disk as it was given,
with episodes per row, every writer failure raised, one recorder per directory, continued recordings numbered after
what is there, and a read-only or full disk said in one line."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from inference.bundle.recording import index_recording, read_recording
from inference.bundle.recording.chunk import write_chunk
from inference.errors import UsageError
from inference.field import Recorder

REPO = Path(__file__).resolve().parents[1]


def call(rec: Recorder, n: int = 1, value: float = 0.0, noise: np.ndarray | None = None) -> None:
    """One act call of the CartPole bundle's ``policy`` graph with ``n`` rows."""
    obs = np.full((n, 4), value, np.float32)
    action = np.zeros(n, np.int32)
    rec.record([obs], {"action": action, "logits": np.zeros((n, 2), np.float32)}, action, host_noise=noise)


def play(rec: Recorder, lengths: list[int], reset: bool = False) -> None:
    """One env: episodes of ``lengths`` steps, reward 1 per step, done at each end (``reset()`` after it or not)."""
    for length in lengths:
        for t in range(length):
            call(rec)
            rec.observe(1.0, t == length - 1)
        if reset:
            rec.new_episode()


def returns(directory: Path, bundle) -> list[float]:
    return sorted(r for _, _, r in read_recording([directory], bundle).episode_returns())


@pytest.mark.parametrize("reset", [False, True])
def test_an_episode_ends_at_done_with_or_without_reset(cartpole_bundle, tmp_path, reset):
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy", chunk_steps=4) as rec:
        play(rec, [3, 3, 5], reset=reset)
    recording = read_recording([tmp_path / "rec"], cartpole_bundle)
    assert returns(tmp_path / "rec", cartpole_bundle) == [3.0, 3.0, 5.0]  # not one episode of 11
    assert recording.episode.tolist() == [0] * 3 + [1] * 3 + [2] * 5  # reset() after done: no episode skipped


def test_reset_starts_new_episodes_only_for_rows_with_steps(cartpole_bundle, tmp_path):
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as rec:
        call(rec, 3)
        rec.observe(np.ones(3), np.array([False, True, False]))
        call(rec, 3)  # row 1 starts its second episode here
        rec.observe(np.ones(3), np.array([True, True, False]))
        rec.new_episode()  # rows 0 and 1 ended already: only row 2 needs a new episode
        call(rec, 3)
        rec.observe(np.ones(3), np.ones(3, bool))
    recording = read_recording([tmp_path / "rec"], cartpole_bundle)
    assert recording.episode.reshape(3, 3).tolist() == [[0, 1, 2], [0, 3, 2], [4, 5, 6]]
    assert sorted((e, env, r) for e, env, r in recording.episode_returns()) == [
        (0, 0, 2.0), (1, 1, 1.0), (3, 1, 1.0), (4, 0, 1.0), (5, 1, 1.0), (6, 2, 1.0)]  # fmt: skip
    assert recording.env.tolist() == [0, 1, 2] * 3


def test_observe_checks_the_rewards_and_dones_against_the_call(cartpole_bundle, tmp_path):
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as rec:
        with pytest.raises(UsageError, match=r"observe\(\) before any act"):
            rec.observe(1.0)
        call(rec, 3)
        for reward, done, message in [(np.ones(2), None, r"reward has shape \[2\], the last act\(\) had 3 row"),
                                      (1.0, None, r"reward has shape \[\], the last act\(\) had 3 row"),
                                      (np.ones(3), True, r"done has shape \[\]"),
                                      (np.ones(3), np.array([0, 2, 1]), "other than 0 and 1"),
                                      (np.array(["a", "b", "c"]), None, "expected numbers")]:  # fmt: skip
            with pytest.raises(UsageError, match=message) as caught:
                rec.observe(reward, done)
            assert "\n" not in str(caught.value)
        rec.observe(np.ones(3), False)  # a scalar False: no episode ended
        call(rec, 1)
        rec.observe(np.array([2.0]), np.array([True]))  # one row: a scalar or a 1-vector
    recording = read_recording([tmp_path / "rec"], cartpole_bundle)
    assert recording.reward.tolist() == [1.0, 1.0, 1.0, 2.0] and recording.done.tolist() == [False] * 3 + [True]


def test_record_keeps_one_layout(cartpole_bundle, tmp_path):
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as rec:
        call(rec, 2)
        action = np.zeros(2, np.int32)
        with pytest.raises(UsageError, match=r"input 0 is float64\[2, 4\], the graph takes float32"):
            rec.record([np.zeros((2, 4))], {"action": action, "logits": np.zeros((2, 2), np.float32)}, action)
        with pytest.raises(UsageError, match="output 'logits' is float32"):
            rec.record([np.zeros((2, 4), np.float32)], {"action": action, "logits": np.zeros((2, 3), np.float32)},
                       action)  # fmt: skip
        with pytest.raises(UsageError, match="the outputs lack 'logits'"):
            rec.record([np.zeros((2, 4), np.float32)], {"action": action}, action)
        call(rec, 2)
    assert len(read_recording([tmp_path / "rec"], cartpole_bundle)) == 4


def test_host_noise_is_recorded_per_step(cartpole_bundle, tmp_path):
    noise = np.random.default_rng(0).random((3, 2), np.float32)
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as rec:
        call(rec, 3, noise=noise)
        call(rec, 2)  # a call without noise: NaN rows
    recording = read_recording([tmp_path / "rec"], cartpole_bundle)
    assert recording.host_noise is not None and recording.host_noise.dtype == np.float32
    assert np.array_equal(recording.host_noise[:3], noise) and np.isnan(recording.host_noise[3:]).all()


def _wait(predicate, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert predicate()


def test_a_writer_failure_is_raised_counted_and_announced(cartpole_bundle, tmp_path, monkeypatch):
    """Any failure of the writer (here a ValueError, not an OSError) is raised at the next call and by close(); the
    chunks that could be written are, and the next one names the lost chunk so an audit tells it from a deletion."""
    import inference.field.sink as field

    real = field.write_chunk

    def failing(path, arrays, meta):
        if meta["chunk"] == 1:
            raise ValueError("rewards of another shape")
        real(path, arrays, meta)

    monkeypatch.setattr(field, "write_chunk", failing)
    rec = Recorder(tmp_path / "rec", cartpole_bundle, "policy", chunk_steps=4)
    for _ in range(9):  # chunks 0 and 1 handed to the writer
        call(rec)
        rec.observe(1.0)
    _wait(lambda: rec.write_errors == 1)
    with pytest.raises(UsageError, match=r"chunk-000001.npz \(4 steps\) could not be written: ValueError: rewards"):
        call(rec)
    call(rec)  # the recording goes on: what can be written is written
    with pytest.raises(UsageError) as caught:
        rec.close()
    assert "1 chunk(s) could not be written, 4 step(s) lost" in str(caught.value) and "\n" not in str(caught.value)
    assert rec.dropped_steps == 4
    names = sorted(p.name for p in (tmp_path / "rec").glob("chunk-*"))
    assert names == ["chunk-000000.npz", "chunk-000002.npz"]
    index = index_recording([tmp_path / "rec"], cartpole_bundle)  # the gap is announced, not a deletion
    assert index.lost == [{"recording": str(tmp_path / "rec"), "chunk": 1, "steps": 4,
                           "why": "write failed: rewards of another shape"}]  # fmt: skip
    assert index.steps == 6  # 4 + 2 (the call that raised was not recorded)


def test_one_recorder_per_directory(cartpole_bundle, tmp_path):
    first = Recorder(tmp_path / "rec", cartpole_bundle, "policy")
    with pytest.raises(UsageError, match=rf"being recorded by another recorder \(pid {os.getpid()}\)") as caught:
        Recorder(tmp_path / "rec", cartpole_bundle, "policy")
    assert "\n" not in str(caught.value)
    call(first)
    first.close()
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as second:  # released by close
        call(second)
    lock = tmp_path / "rec" / ".recorder.lock"
    assert not lock.exists()  # close() leaves no lock file behind
    holder = subprocess.Popen([sys.executable, "-c", f"import fcntl, os, time\nfd = os.open({str(lock)!r}, "
                               "os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nos.ftruncate(fd, 0)\n"
                               "os.pwrite(fd, b'%d\\n' % os.getpid(), 0)\nprint('locked', flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UsageError, match=rf"\(pid {holder.pid}\)"):
            Recorder(tmp_path / "rec", cartpole_bundle, "policy")
    finally:
        holder.kill()
        holder.wait()
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy"):  # the system released the dead holder's lock
        pass


def test_a_continued_recording_numbers_chunks_and_episodes_after_the_last(cartpole_bundle, tmp_path):
    for _ in range(2):  # two runs into one directory: 2 ended episodes and one cut short each
        with Recorder(tmp_path / "rec", cartpole_bundle, "policy", chunk_steps=4) as rec:
            play(rec, [3, 5])
            call(rec)
            rec.observe(1.0)
    index = index_recording([tmp_path / "rec"], cartpole_bundle)
    assert [c.index for c in index.chunks] == list(range(6)) and index.sessions == 2
    recording = read_recording([tmp_path / "rec"], cartpole_bundle)
    assert recording.episode.tolist() == [0] * 3 + [1] * 5 + [2] + [3] * 3 + [4] * 5 + [5]
    assert returns(tmp_path / "rec", cartpole_bundle) == [3.0, 3.0, 5.0, 5.0]


def test_a_directory_with_another_bundles_recording_is_refused(cartpole_bundle, tmp_path):
    directory = tmp_path / "rec"
    with Recorder(directory, cartpole_bundle, "policy") as rec:
        call(rec)
    with np.load(directory / "chunk-000000.npz") as data:
        arrays = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    write_chunk(directory / "chunk-000000.npz", arrays, {**meta, "manifest_sha256": "0" * 64})
    with pytest.raises(UsageError, match="holds a recording of another bundle"):
        Recorder(directory, cartpole_bundle, "policy")
    with pytest.raises(UsageError, match="holds a recording of graph 'policy', this policy acts with 'policy_sample'"):
        write_chunk(directory / "chunk-000000.npz", arrays, meta)
        Recorder(directory, cartpole_bundle, "policy_sample")


def test_a_recorder_never_closed_is_written_when_collected(cartpole_bundle, tmp_path):
    rec = Recorder(tmp_path / "rec", cartpole_bundle, "policy")
    for _ in range(5):
        call(rec)
        rec.observe(1.0)
    del rec
    gc.collect()
    assert len(read_recording([tmp_path / "rec"], cartpole_bundle)) == 5
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy"):  # the lock went with it
        pass


def test_a_call_cut_short_by_ctrl_c_is_left_out(cartpole_bundle, tmp_path):
    class Interrupting(dict):
        def __getitem__(self, key):
            if key == "logits":
                raise KeyboardInterrupt
            return super().__getitem__(key)

    rec = Recorder(tmp_path / "rec", cartpole_bundle, "policy")
    call(rec)
    outputs = Interrupting(action=np.zeros(1, np.int32), logits=np.zeros((1, 2), np.float32))
    with pytest.raises(KeyboardInterrupt):  # inside record(), after the inputs were appended
        rec.record([np.zeros((1, 4), np.float32)], outputs, np.zeros(1, np.int32))
    rec.close()
    assert len(read_recording([tmp_path / "rec"], cartpole_bundle)) == 1


def test_sigterm_is_handled_only_where_it_has_its_default_action(cartpole_bundle, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with Recorder(tmp_path / "a", cartpole_bundle, "policy"):
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, before)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back at close
        own = lambda *_: None  # noqa: E731
        signal.signal(signal.SIGTERM, own)
        with Recorder(tmp_path / "b", cartpole_bundle, "policy"):
            assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def mounted_tmpfs(where: Path, options: str):
    """A tmpfs at ``where`` (root only); None where mounting is not allowed."""
    where.mkdir()
    ok = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                              capture_output=True).returncode == 0  # fmt: skip
    try:
        yield where if ok else None
    finally:
        if ok:
            subprocess.run(["umount", str(where)], check=True)


def read_only_dir(tmp_path: Path, stack: contextlib.ExitStack) -> Path:
    """A directory nothing can be written to: a read-only tmpfs as root, else a directory without write permission."""
    where = stack.enter_context(mounted_tmpfs(tmp_path / "ro", "ro,size=64k"))
    if where is None:
        where = tmp_path / "ro"
        where.chmod(0o555)
        stack.callback(where.chmod, 0o755)
        if os.access(where, os.W_OK):
            pytest.fail("cannot make a read-only directory here (root without mount)")
    return where


def test_a_read_only_directory_is_one_line(cartpole_bundle, tmp_path):
    with contextlib.ExitStack() as stack:
        target = read_only_dir(tmp_path, stack)
        with pytest.raises(UsageError, match=rf"cannot record into {target}.*: (Read-only file system|Permission)"):
            Recorder(target / "rec", cartpole_bundle, "policy")
        with pytest.raises(UsageError, match=rf"cannot record into {target}: (Read-only file system|Permission)"):
            Recorder(target, cartpole_bundle, "policy")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "inference.play",
                str(cartpole_bundle.root),
                "--episodes",
                "1",
                "--record",
                str(target),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert errors[0].startswith(f"error: cannot record into {target}"), errors


def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(cartpole_bundle, tmp_path, monkeypatch):
    import inference.bundle.recording as recording

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(recording.os, "fsync", full)
    rec = Recorder(tmp_path / "rec", cartpole_bundle, "policy", chunk_steps=4)
    for _ in range(6):
        call(rec)
    with pytest.raises(UsageError, match="could not be written: OSError: .*No space left on device") as caught:
        rec.close()
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == []  # no chunk, no .tmp, no lock file


def test_play_on_a_full_disk_says_so_in_one_line(cartpole_bundle, tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=48k") as where:
        if where is None:
            pytest.skip("mounting a small tmpfs needs root (the in-process variant above runs everywhere)")
        proc = subprocess.run([sys.executable, "-m", "inference.play", str(cartpole_bundle.root), "--episodes", "400",
                               "--record", str(where / "rec")], capture_output=True, text=True, cwd=REPO,
                              timeout=600)  # fmt: skip
        errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert "could not be written: OSError: [Errno 28] No space left on device" in errors[0]
        assert not list((where / "rec").glob(".*.tmp"))


def test_record_takes_rewards_and_dones_too(cartpole_bundle, tmp_path):
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as rec:
        for t in range(4):
            obs, action = np.zeros((1, 4), np.float32), np.zeros(1, np.int32)
            rec.record([obs], {"action": action, "logits": np.zeros((1, 2), np.float32)}, action, 1.0, t == 1)
    assert returns(tmp_path / "rec", cartpole_bundle) == [2.0]  # the second episode never ended


FORKED = """
    import os, sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from inference.bundle import load_bundle
    from inference.errors import UsageError
    from inference.field import Recorder
    from test_recorder import call
    bundle = load_bundle({bundle!r})
    rec = Recorder({out!r}, bundle, "policy")
    for _ in range(10):
        call(rec)
    pid = os.fork()
    if pid == 0:
        try:
            call(rec)  # the parent's recorder: refused in one line, never recorded to nowhere
            os._exit(8)
        except UsageError as exc:
            if "forked child cannot record" not in str(exc):
                os._exit(9)
        sys.exit(0)  # the child's exit runs the finaliser it inherited
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, os.waitstatus_to_exitcode(status)
    try:
        Recorder({out!r}, bundle, "policy")
        print("lock lost")
    except UsageError:
        print("still locked")
    for _ in range(10):
        call(rec)
    rec.close()
"""


def test_a_forked_child_neither_writes_nor_unlocks_the_recording(cartpole_bundle, tmp_path):
    script = "import sys\nsys.modules['mindspore'] = None\n" + textwrap.dedent(
        FORKED.format(tests=str(REPO / "tests"), bundle=str(cartpole_bundle.root), out=str(tmp_path / "rec"))
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "still locked", proc.stdout + proc.stderr[-2000:]
    index = index_recording([tmp_path / "rec"], cartpole_bundle)
    assert len(index.chunks) == 1 and index.steps == 20


def test_a_second_observe_for_one_act_is_refused_not_overwritten(cartpole_bundle, tmp_path):
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as rec:
        call(rec)
        rec.observe(1.0, False)
        with pytest.raises(UsageError, match="observe\\(\\) twice after one act\\(\\)"):
            rec.observe(5.0, True)
        call(rec)
        rec.observe(2.0, True)
    assert returns(tmp_path / "rec", cartpole_bundle) == [3.0]  # the first answer kept: 1 + 2


def test_an_action_of_another_layout_is_refused_at_the_call(cartpole_bundle, tmp_path):
    with Recorder(tmp_path / "rec", cartpole_bundle, "policy") as rec:
        call(rec, 2)
        outputs = {"action": np.zeros(2, np.int32), "logits": np.zeros((2, 2), np.float32)}
        with pytest.raises(UsageError, match=r"record\(\): action is int64\[2, 1\] for 2 row\(s\)"):
            rec.record([np.zeros((2, 4), np.float32)], outputs, np.zeros((2, 1), np.int64))
        call(rec, 2)
    assert len(read_recording([tmp_path / "rec"], cartpole_bundle)) == 4
