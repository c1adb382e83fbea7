"""Where the tasks run: in this process, in order (:class:`Serial`, the
default, no dependency), or on a Dask cluster (:class:`Dask`: a
``LocalCluster`` of N worker processes, or an existing scheduler).

Both have one interface: ``submit(fn, *args)`` gives a handle,
``completed(handles)`` yields handles as they finish (more may be added
while iterating, with ``.add``), ``outcome(handle)`` is ``(True, value)`` or
``(False, exception)``. A task's exception is its outcome, never the run's:
one bad dump does not stop the others. Ctrl-C is not a task's exception: it
leaves the ``with`` block, which shuts the cluster down (its worker
processes with it).
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import sys
import warnings
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, Optional, TextIO, Tuple


class _Task:
    __slots__ = ("fn", "args", "ok", "value")

    def __init__(self, fn: Callable[..., Any], args: Tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.ok: Optional[bool] = None
        self.value: Any = None


class _Queue:
    """The serial ``completed``: runs each task when its turn comes, in the
    order submitted."""

    def __init__(self, tasks: Iterable[_Task]) -> None:
        self._q: Deque[_Task] = collections.deque(tasks)

    def add(self, task: _Task) -> None:
        self._q.append(task)

    def __iter__(self) -> Iterator[_Task]:
        while self._q:
            t = self._q.popleft()
            try:
                t.value, t.ok = t.fn(*t.args), True
            except Exception as e:  # a task's failure is its outcome (Ctrl-C is not an Exception)
                t.value, t.ok = e, False
            yield t


class Serial:
    """Every task in this process, one at a time, in the order submitted."""

    workers = 1

    def __enter__(self) -> "Serial":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def submit(self, fn: Callable[..., Any], *args: Any) -> _Task:
        return _Task(fn, args)

    def completed(self, handles: Iterable[_Task]) -> _Queue:
        return _Queue(handles)

    def outcome(self, handle: _Task) -> Tuple[bool, Any]:
        return bool(handle.ok), handle.value


def _dask() -> Any:
    try:
        import distributed
    except ImportError:
        raise ImportError(
            "--workers and --scheduler run on Dask: pip install 'kvselect[distributed]' "
            "(or dask[distributed]); without them the run is serial, in this process"
        ) from None
    return distributed


class Dask:
    """Tasks on a Dask cluster: a ``LocalCluster`` of ``workers`` processes
    (one task thread each), or the existing cluster at ``scheduler``.

    ``timeout`` (seconds) bounds the wait for the scheduler: past it, an
    ``OSError``. A worker that dies takes its running tasks with it; the scheduler
    reruns them elsewhere (they are pure: same inputs, same value), and only
    after a task has killed ``distributed.scheduler.allowed-failures``
    workers does it fail, as ``KilledWorker``.
    """

    def __init__(
        self,
        workers: Optional[int] = None,
        scheduler: Optional[str] = None,
        log: Optional[TextIO] = None,
        timeout: float = 30.0,
    ) -> None:
        if (workers is None) == (scheduler is None):
            raise ValueError("Dask: give workers (a local cluster) or scheduler (an address), one")
        self.scheduler, self.log, self.timeout = scheduler, log, timeout
        self.workers = workers or 0
        self.cluster: Any = None
        self.client: Any = None
        #: Per host, the task threads of every worker on it (set on entry).
        self.host_threads: Dict[str, int] = {}
        self._distributed = _dask()

    def __enter__(self) -> "Dask":
        d = self._distributed
        try:
            if self.scheduler is not None:
                self.client = d.Client(self.scheduler, timeout=self.timeout)  # OSError past it
                self.workers = len(self.client.scheduler_info()["workers"])
                print(
                    f"kvselect: on the Dask scheduler at {self.scheduler} ({self.workers} workers)",
                    file=self.log or sys.stderr,
                )
            else:
                import dask

                # Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also turns off
                # glibc's adaptive mmap threshold: every large array is then a fresh mmap whose
                # pages fault in on first touch, and a task here (tens of MiB of temporaries)
                # took 1.9x as long (benches/corpus_dask.py). The nannies read this setting
                # once, when made: restarted workers keep it.
                environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
                environ.pop("MALLOC_TRIM_THRESHOLD_", None)
                with warnings.catch_warnings(), dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
                    warnings.simplefilter("ignore", UserWarning)  # "port 8787 in use": the link says
                    self.cluster = d.LocalCluster(
                        n_workers=self.workers, threads_per_worker=1, processes=True, silence_logs=logging.CRITICAL
                    )
                self.client = d.Client(self.cluster)
                link = (
                    self.cluster.dashboard_link
                    if self._has_bokeh()
                    else ("none (the dashboard needs bokeh: pip install 'kvselect[distributed]')")
                )
                print(
                    f"kvselect: a local Dask cluster of {self.workers} workers; dashboard: {link}",
                    file=self.log or sys.stderr,
                )
            for info in self.client.scheduler_info()["workers"].values():
                host = str(info["host"])
                self.host_threads[host] = self.host_threads.get(host, 0) + int(info["nthreads"])
        except BaseException:
            self.__exit__()
            raise
        return self

    @staticmethod
    def _has_bokeh() -> bool:
        return importlib.util.find_spec("bokeh") is not None

    def __exit__(self, *exc: Any) -> None:
        # Cancel what is left and shut down: no worker process outlives the run.
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(fn, *args, pure=False)

    def completed(self, handles: Iterable[Any]) -> Any:
        return self._distributed.as_completed(list(handles))

    def outcome(self, handle: Any) -> Tuple[bool, Any]:
        # result(), not the status: a finished task's value lives on its worker, and a
        # worker that dies before the value is fetched takes it along — the future is
        # then computed again and result() waits for it (its status meanwhile says
        # "pending", and exception() would return None once it succeeded).
        try:
            return True, handle.result()
        except Exception as e:  # the task's own exception, or KilledWorker
            return False, e
