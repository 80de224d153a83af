"""Per-rank checkpoints that survive a rank dying mid-write (ChainerMN's multi-node
checkpointer), with the C++ mncl::Checkpointer's files and rules:

    ckpt = mncl.Checkpointer(comm, "/ckpt", "mlp")
    found = ckpt.resume()                  # collective: None, or (iteration, state)
    start = 0 if found is None else found[0] + 1
    ...; ckpt.save(iteration, state)       # local, every rank: state pickled

Each rank writes `<directory>/<name>.<rank>.<iteration>` (on a communicator split from the
world, `<name>.<group>.<rank>.<iteration>`: Communicator.group_path) atomically: a temporary
file, fsync, rename, fsync of the directory. The header is the C++ checkpointer's (magic, rank,
job size, iteration, CRC-32s of header and payload); the payload is the pickled state. After a
save the rank keeps its `keep` newest snapshots.

resume() verifies this rank's snapshots (a partial, truncated or corrupt one is skipped, with a
message), the ranks agree on the newest iteration every one of them holds intact, load it, and
confirm that every rank loaded it (else they try the next older one). Newer snapshots than the
one resumed belonged to a run that did not finish them everywhere, and are deleted, as are
temporaries of a writer that died. A snapshot of a job of another size is never loaded,
overwritten, pruned or deleted: a resume that finds nothing else raises CheckpointError on
every rank naming that size. A load that refuses what it gets (a ValueError from `load`: it
decodes but does not fit this run) raises InvalidArgumentError on every rank, with nothing
deleted and no older snapshot loaded in its place.
"""

import operator
import os
import pickle
import re
import struct
import sys
import zlib

from .errors import InvalidArgumentError, SystemCallError

_MAGIC = b"MNCLCKPT"
# magic 8 | version 4 | rank 4 | size 4 | group length 4 | iteration 8 | payload length 8 |
# payload crc 4 | header crc 4 (over the 44 bytes before it, then the group) | group | payload.
_HEADER = struct.Struct("<8sIIIIQQI")  # the 44 bytes the header's CRC covers
_HEADER_BYTES = _HEADER.size + 4
_WHOLE_JOB_VERSION, _GROUP_VERSION = 1, 2
_MAX_ITERATION = (1 << 64) - 1


class CheckpointError(SystemCallError):
    """A checkpoint that cannot be written, or a resume that cannot go on (C++: CheckpointError)."""


def _group_name(group):
    return "the whole job" if not group else f"group '{group}'"


class Checkpointer:
    """See the module docstring. `comm` must outlive the checkpointer."""

    def __init__(self, comm, directory, name, keep=2, sync=True, verbose=True, group=None):
        if not name or "/" in name:
            raise InvalidArgumentError(f"mncl: Checkpointer: the name {name!r} must be "
                                       f"non-empty without '/'")
        if operator.index(keep) < 1:
            raise InvalidArgumentError("mncl: Checkpointer: keep must be at least 1")
        if group and not re.fullmatch(r"[A-Za-z0-9_-]+", group):
            raise InvalidArgumentError(f"mncl: Checkpointer: the group {group!r} may only hold "
                                       f"letters, digits, '_' and '-'")
        # Ranks of different groups share rank numbers: without the group in the file names
        # they would write the same files and load each other's states.
        path = getattr(comm, "group_path", None)
        if path is None and not group:
            raise InvalidArgumentError(
                "mncl: Checkpointer: this communicator's group of the job is unknown (it was "
                "made by split_host or split_cross_host), so its snapshots could not be told "
                "from other groups' (same file names, same ranks): name the group in group=")
        self.comm, self.name, self.keep = comm, name, int(keep)
        self.sync, self.verbose = sync, verbose
        self.group = (path or "") + (f"u{group}" if group else "")
        self.directory = os.fspath(directory) or "."
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"mncl: checkpointer: creating {self.directory}: "
                                  f"{e.strerror}") from e

    # --- files -----------------------------------------------------------------------------

    def _prefix(self):
        """'<name>.[<group>.]<rank>.': this rank's files start with it."""
        group = f"{self.group}." if self.group else ""
        return f"{self.name}.{group}{self.comm.rank}."

    def path(self, iteration):
        return os.path.join(self.directory, f"{self._prefix()}{operator.index(iteration)}")

    def _listed(self, temporaries=None):
        """Iterations of this rank's snapshot files, sorted, verified or not; the paths of its
        temporaries go to `temporaries`."""
        prefix, found = self._prefix(), []
        try:
            entries = os.listdir(self.directory)
        except OSError:
            return found
        for entry in entries:
            if not entry.startswith(prefix):
                continue
            rest = entry[len(prefix):]
            iteration = _iteration(rest)
            if iteration is not None:
                found.append(iteration)
            elif (temporaries is not None and rest.endswith(".tmp")
                  and _iteration(rest[:-4]) is not None):
                temporaries.append(os.path.join(self.directory, entry))
        return sorted(found)

    def _check_header(self, data, iteration):
        """(payload offset, None) or (None, why)."""
        if len(data) < _HEADER_BYTES:
            return None, f"truncated: {len(data)} bytes, no complete header"
        magic, version, rank, _, group_length, it, _, _ = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            return None, "not an MNCL checkpoint"
        if group_length > len(data) - _HEADER_BYTES:
            return None, (f"truncated: the header's group of {group_length} bytes is not all "
                          f"there")
        group = data[_HEADER_BYTES:_HEADER_BYTES + group_length]
        (header_crc,) = struct.unpack_from("<I", data, _HEADER.size)
        if header_crc != zlib.crc32(group, zlib.crc32(data[:_HEADER.size])):
            return None, "header checksum mismatch"
        if version != (_GROUP_VERSION if group else _WHOLE_JOB_VERSION):
            return None, f"format version {version}"
        if rank != self.comm.rank or it != iteration:
            return None, f"header names rank {rank} iteration {it}"
        group = group.decode("utf-8", "replace")
        if group != self.group:  # another group's state, however it got this name
            return None, (f"written by {_group_name(group)}, this rank checkpoints "
                          f"{_group_name(self.group)}")
        return _HEADER_BYTES + group_length, None

    def _written_job_size(self, iteration):
        """The job size in the header of a snapshot whose header verifies, else None."""
        try:
            with open(self.path(iteration), "rb") as f:
                head = f.read(_HEADER_BYTES)
                if len(head) == _HEADER_BYTES:
                    # A corrupt length fails the checksum after a bounded read.
                    (group_length,) = struct.unpack_from("<I", head, 20)
                    head += f.read(min(group_length, 4096))
        except OSError:
            return None
        offset, _ = self._check_header(head, iteration)
        return None if offset is None else struct.unpack_from("<I", head, 16)[0]

    def _of_another_job_size(self, iteration):
        size = self._written_job_size(iteration)
        return size is not None and size != self.comm.size

    def read_snapshot(self, iteration):
        """(payload bytes, None), or (None, the reason) for this rank's snapshot."""
        try:
            with open(self.path(iteration), "rb") as f:
                data = f.read()
        except OSError as e:
            return None, f"cannot open: {e.strerror}"
        offset, why = self._check_header(data, iteration)
        if offset is None:
            return None, why
        length, payload_crc = struct.unpack_from("<QI", data, 32)
        if length != len(data) - offset:
            return None, f"payload is {len(data) - offset} bytes, header says {length}"
        payload = data[offset:]
        if payload_crc != zlib.crc32(payload):
            return None, "payload checksum mismatch"
        size = struct.unpack_from("<I", data, 16)[0]
        if size != self.comm.size:  # never loaded into a job of another size
            return None, f"written by a job of {size} ranks"
        return payload, None

    def _scan(self):
        """(iterations that verify, [(iteration, job size)] of another job size), oldest
        first."""
        valid, another_job = [], []
        for iteration in self._listed():
            payload, why = self.read_snapshot(iteration)
            if payload is not None:
                valid.append(iteration)
                continue
            size = self._written_job_size(iteration)
            if size is not None and size != self.comm.size:
                another_job.append((iteration, size))
            if self.verbose:
                print(f"mncl checkpointer: rank {self.comm.rank}: skipping "
                      f"{self.path(iteration)}: {why}", file=sys.stderr, flush=True)
        return valid, another_job

    def local_iterations(self):
        """This rank's snapshots that verify, oldest first."""
        return self._scan()[0]

    # --- save ------------------------------------------------------------------------------

    def save(self, iteration, state):
        """Local: writes this rank's snapshot of `state` (pickled) for `iteration`, then keeps
        the `keep` newest (and deletes newer ones: an abandoned future must never win a
        resume)."""
        self.save_bytes(iteration, pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))

    def save_bytes(self, iteration, payload):
        iteration = operator.index(iteration)
        if not 0 <= iteration <= _MAX_ITERATION:
            raise InvalidArgumentError(f"mncl: Checkpointer.save: iteration {iteration} is not "
                                       f"a uint64")
        payload = memoryview(payload).tobytes()  # bytes-like only (bytes(5) is five zeros)
        group = self.group.encode()
        head = _HEADER.pack(_MAGIC, _GROUP_VERSION if group else _WHOLE_JOB_VERSION,
                            self.comm.rank, self.comm.size, len(group), iteration, len(payload),
                            zlib.crc32(payload))
        head += struct.pack("<I", zlib.crc32(group, zlib.crc32(head)))
        final = self.path(iteration)
        size = self._written_job_size(iteration)
        if size is not None and size != self.comm.size:
            raise CheckpointError(f"mncl: checkpointer: {final} holds a snapshot of a job of "
                                  f"{size} ranks; this job has {self.comm.size}: checkpoint to "
                                  f"another directory or name (it was not overwritten)")
        # Written under a temporary name and renamed: a reader sees the old file or the new one.
        temp = final + ".tmp"
        try:
            with open(temp, "wb") as f:
                f.write(head + group)
                f.write(payload)
                f.flush()
                if self.sync:
                    os.fsync(f.fileno())
            os.rename(temp, final)
            if self.sync:
                fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as e:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise CheckpointError(f"mncl: checkpointer: writing {final}: {e.strerror}") from e
        self._prune(iteration)

    def _remove(self, iteration):
        try:
            os.unlink(self.path(iteration))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise CheckpointError(f"mncl: checkpointer: removing {self.path(iteration)}: "
                                  f"{e.strerror}") from e

    def _prune(self, newest_kept):
        kept = []
        for iteration in self._listed():
            if self._of_another_job_size(iteration):
                continue  # neither this job's to count nor to delete
            if iteration > newest_kept:
                self._remove(iteration)
            else:
                kept.append(iteration)
        for iteration in kept[:max(len(kept) - self.keep, 0)]:
            self._remove(iteration)

    # --- resume ----------------------------------------------------------------------------

    def resume(self, load=None):
        """Collective: (iteration, state) of the newest snapshot every rank holds intact and
        loads, or None (nothing to resume). state is the unpickled object, or load(that object)
        when load is given: a load that raises ValueError refuses the snapshot for this run's
        settings (InvalidArgumentError on every rank, nothing deleted, no older one loaded);
        a payload that does not unpickle, or another exception from load, counts as a snapshot
        this rank cannot load, and the ranks try an older one. When no older one loads everywhere
        after some rank's load ran, every rank raises CheckpointError (their states may
        differ). Raises CheckpointError on every rank when nothing can be resumed but
        snapshots of a job of another size are there."""
        comm = self.comm
        valid, another_job = self._scan()
        everyone = comm.allgather_obj(valid)
        common = set(everyone[0]).intersection(*everyone[1:])
        touched, touched_why = None, ""
        for iteration in sorted(common, reverse=True):
            loaded, ran, refused, why, state = 0, 0, 0, "", None
            payload, why = self.read_snapshot(iteration)
            if payload is not None:
                ran = 1
                try:
                    state = pickle.loads(payload)
                except Exception as e:  # noqa: BLE001 (does not decode: an older one may)
                    why, payload = f"does not unpickle: {type(e).__name__}: {e}", None
            if payload is not None:
                try:
                    if load is not None:
                        state = load(state)
                    loaded = 1
                except ValueError as e:
                    # Decoded, but not for this run (an optimizer's settings, say): an older
                    # snapshot would roll training back, and resuming deletes newer ones.
                    why, refused = f"{type(e).__name__}: {e}", 1
                except Exception as e:  # noqa: BLE001 (this rank cannot load it: tell all)
                    why = f"{type(e).__name__}: {e}"
            if not loaded and self.verbose:
                print(f"mncl checkpointer: rank {comm.rank}: cannot load "
                      f"{self.path(iteration)}: {why}", file=sys.stderr, flush=True)
            counts = comm.allreduce_obj((loaded, ran, refused), op=lambda a, b: tuple(
                x + y for x, y in zip(a, b)))
            if counts[0] == comm.size:
                self._remove_leftovers(iteration)
                return iteration, state
            # Every rank takes the same branches from here: the counts are the same everywhere.
            first_why = self._first_reason(why if counts[2] == 0 or refused else "")
            if counts[2]:
                raise InvalidArgumentError(
                    f"mncl: Checkpointer.resume: the snapshot of iteration {iteration} does not "
                    f"fit this run ({first_why}); no older one was loaded and nothing was "
                    f"deleted: resume with the settings it was saved with")
            if counts[1] and touched is None:
                touched = iteration
                touched_why = (f"{first_why}; {counts[1]} of {comm.size} ranks ran its load, "
                               f"{counts[0]} loaded it whole")
        if touched is not None:
            raise CheckpointError(
                f"mncl: Checkpointer.resume: the snapshot of iteration {touched} could not be "
                f"loaded on every rank ({touched_why}), and no older one that every rank holds "
                f"loads; with a load= that changes state, the ranks' states may now differ: "
                f"rebuild it before training")
        # Nothing to resume, but intact snapshots of a job of another size: starting afresh
        # would let the first saves overwrite them (same names). Every rank raises alike.
        for rank, theirs in enumerate(comm.allgather_obj(another_job)):
            if theirs:
                newest, size = theirs[-1]
                raise CheckpointError(
                    f"mncl: Checkpointer.resume: {self.directory} holds snapshots of "
                    f"'{self.name}' that a job of {size} ranks wrote (rank {rank}'s newest: "
                    f"iteration {newest}) and none that this job of {comm.size} ranks can "
                    f"resume: run with the job size that wrote them, or checkpoint to another "
                    f"directory or name; nothing was loaded or deleted")
        self._remove_leftovers(None)
        return None

    def _first_reason(self, mine):
        """Collective: the first rank's non-empty reason, as 'rank r: reason'."""
        for rank, reason in enumerate(self.comm.allgather_obj(mine)):
            if reason:
                return f"rank {rank}: {reason}"
        return "no rank said why"

    def _remove_leftovers(self, resumed):
        temporaries = []
        for iteration in self._listed(temporaries):
            # Newer than what everyone resumed from: a run that did not finish them on every
            # rank (a job of another size's are kept).
            if resumed is not None and iteration > resumed and \
                    not self._of_another_job_size(iteration):
                self._remove(iteration)
        for path in temporaries:  # half-written files of a writer that died
            try:
                os.unlink(path)
            except OSError:
                pass


def _iteration(text):
    """'123' -> 123; anything else (empty, signs, letters, past uint64) -> None."""
    if not text or len(text) > 20 or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= _MAX_ITERATION else None
