"""Fetch a pinned revision's commit with git into losslab's cache, verify it, hand back its files.

`fetch_pinned(revision)` makes (once) a bare repository under `cache_root()` (the user's cache
dir: $LOSSLAB_CACHE_DIR, else $XDG_CACHE_HOME/losslab/sources, else ~/.cache/losslab/sources),
fetches exactly the pinned commit as a partial clone (`git fetch --depth 1 --filter=blob:none
origin <commit>`: the commit and its trees, each file's content when it is first read; then
without the filter, then, for a server that refuses fetching by id, one fetch of its branches),
and checks that the commit is there under its full id before returning `GitFiles` for it.
Files read once stay in the cache; reading a file never read before needs the remote again. A commit already in the cache is
used without touching the network. Offline without a cached copy is a `FetchError` that says
how to proceed (network once, `--source`, or `--allow-rederivation`).

The remote is `https://github.com/<owner>/<repo>.git` unless `remote=` (or the template in
$LOSSLAB_SOURCE_REMOTE, `{repo}`, `{owner}`, `{name}` substituted) says otherwise; tests point
it at `file://` repositories they create.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from losslab.conformance.pinned import GitFiles, PinnedSourceError
from losslab.plan import Revision

FETCH_TIMEOUT_S = 600.0
LOCAL_UPLOAD_PACK = "git -c uploadpack.allowFilter=true upload-pack"


class FetchError(PinnedSourceError):
    """The pinned commit could not be fetched (offline, unknown commit, git failure)."""


def cache_root() -> Path:
    """Where fetched sources live (created on first use)."""
    if os.environ.get("LOSSLAB_CACHE_DIR"):
        return Path(os.environ["LOSSLAB_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "losslab" / "sources"


def remote_for(repo: str, remote: str | None = None) -> str:
    """The git URL to fetch `owner/name` from."""
    template = remote or os.environ.get("LOSSLAB_SOURCE_REMOTE") or "https://github.com/{repo}.git"
    owner, name = repo.split("/", 1)
    return template.format(repo=repo, owner=owner, name=name)


def _git(git_dir: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def _has_commit(git_dir: Path, commit: str) -> str | None:
    if not (git_dir / "HEAD").exists():
        return None
    res = _git(git_dir, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    return res.stdout.strip() if res.returncode == 0 else None


def cached_dir(repo: str, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / (repo.replace("/", "+") + ".git")


def fetch_pinned(
    revision: Revision,
    *,
    cache: Path | None = None,
    remote: str | None = None,
    offline: bool = False,
) -> GitFiles:
    """The files of `revision`'s commit from the cache, fetching the commit first if needed."""
    where = f"revision {revision.text!r}"
    git_dir = cached_dir(revision.repo, cache)
    found = _has_commit(git_dir, revision.commit)
    obtained = "cache"
    if found is None:
        url = remote_for(revision.repo, remote)
        if offline:
            raise FetchError(
                f"{where}: offline and {revision.repo}@{revision.commit[:12]} is not in the "
                f"cache {git_dir}; fetch it once with network, pass --source "
                f"{revision.repo}=PATH (a checkout), or ask for losslab's re-derivation "
                "explicitly (--allow-rederivation)"
            )
        git_dir.mkdir(parents=True, exist_ok=True)
        if not (git_dir / "HEAD").exists():
            init = _git(git_dir, "init", "--bare", "--quiet")
            if init.returncode != 0:
                raise FetchError(f"{where}: git init {git_dir} failed: {init.stderr.strip()}")
        _git(git_dir, "remote", "remove", "origin")
        _git(git_dir, "remote", "add", "origin", url)
        # a partial clone: the commit and its trees now, each file's blob when it is first read
        # (losslab reads a handful of files); the cache's remote is a promisor for the rest
        _git(git_dir, "config", "remote.origin.promisor", "true")
        _git(git_dir, "config", "remote.origin.partialclonefilter", "blob:none")
        if url.startswith("file://") or "://" not in url:
            # a local remote's upload-pack runs here: let it honour the filter
            _git(git_dir, "config", "remote.origin.uploadpack", LOCAL_UPLOAD_PACK)
        errors = []
        attempts = [
            ["fetch", "--quiet", "--depth", "1", "--filter=blob:none", "origin", revision.commit],
            ["fetch", "--quiet", "--depth", "1", "origin", revision.commit],
            ["fetch", "--quiet", "origin", "+refs/heads/*:refs/remotes/origin/*"],
        ]
        for args in attempts:
            try:
                res = _git(git_dir, *args, timeout=FETCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                errors.append(f"git {' '.join(args[:2])}: timed out after {FETCH_TIMEOUT_S:.0f} s")
                continue
            if res.returncode == 0 and _has_commit(git_dir, revision.commit):
                break
            errors.append(
                f"git {' '.join(args[:-1])} ...: {res.stderr.strip() or 'no such commit'}"
            )
        found = _has_commit(git_dir, revision.commit)
        if found is None:
            raise FetchError(
                f"{where}: could not fetch commit {revision.commit} of {revision.repo} from "
                f"{url} ({'; '.join(errors)}); pass --source {revision.repo}=PATH or ask for "
                "losslab's re-derivation explicitly (--allow-rederivation)"
            )
        obtained = f"fetched from {url}"
    if len(revision.commit) == 40 and found != revision.commit.lower():
        raise FetchError(f"{where}: the cache resolved {revision.commit} to {found}")
    files = GitFiles(git_dir, revision)
    files.obtained = obtained  # type: ignore[attr-defined]
    return files
