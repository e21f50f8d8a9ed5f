"""Entry points, read from distribution metadata: what is installed is known before anything is imported.

Detectors, metrics and backends are entry points of their groups (``qinsight.detectors``,
``qinsight.metrics``, ``qinsight.backends``); :func:`installed` lists a group from metadata alone and
:func:`load_entry` imports one entry when it is asked for, its failure one :class:`PluginLoadError`.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

import attrs

from qinsight.core.errors import PluginLoadError


@attrs.frozen(kw_only=True)
class PluginEntry:
    """An installed plugin, known from metadata only (nothing imported)."""

    group: str
    name: str
    distribution: str
    version: str
    target: str  # "module:attribute"

    @property
    def id(self) -> str:
        """A detector's id is its entry point's name."""
        return self.name

    @property
    def source(self) -> str:
        return f"{self.distribution} {self.version} [{self.target}]"


def _path_state() -> tuple[tuple[str, int], ...]:
    """sys.path with each folder's modification time: installing or removing a distribution changes it."""
    state = []
    for folder in sys.path:
        try:
            state.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            state.append((folder, -1))
    return tuple(state)


_SCANS: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[PluginEntry, ...]] = {}


def installed(group: str) -> tuple[PluginEntry, ...]:
    """The plugins of ``group`` installed here, sorted by name; the first distribution on sys.path wins a name.

    Scanning every distribution's metadata takes milliseconds, and a report file
    asks once per result: scans are kept until sys.path or one of its folders changes.
    """
    key = (group, _path_state())
    if key not in _SCANS:
        _SCANS.clear()
        _SCANS[key] = scan_entry_points(group)
    return _SCANS[key]


def scan_entry_points(group: str) -> tuple[PluginEntry, ...]:
    entries: dict[str, PluginEntry] = {}
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != group or ep.name in entries:
                continue
            name = dist.metadata["Name"] or "unknown"
            entries[ep.name] = PluginEntry(
                group=group, name=ep.name, distribution=name, version=dist.version, target=ep.value
            )
    return tuple(sorted(entries.values(), key=lambda e: e.name))


def load_entry(entry: PluginEntry, *, kind: str) -> object:
    """Import the object ``entry`` names; any failure is a :class:`PluginLoadError` of that plugin."""
    try:
        return importlib.metadata.EntryPoint(name=entry.name, value=entry.target, group=entry.group).load()
    except (Exception, SystemExit) as exc:  # an import error of any kind is the plugin's, sys.exit() included
        raise PluginLoadError(entry.name, entry.source, f"{type(exc).__name__}: {exc}", kind=kind) from exc


__all__ = ["PluginEntry", "installed", "load_entry", "scan_entry_points"]
