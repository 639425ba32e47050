"""The embedded model's build cache: a second data dir copies the first build (same bytes),
and a cache that cannot be written costs nothing but the copy."""

from __future__ import annotations

import logging

from node.learner.tiny_model import ensure_embedded


def _files(base):
    return {p.name: p.read_bytes() for p in base.iterdir() if p.is_file()}


def test_a_second_data_dir_copies_the_build_and_a_broken_cache_only_costs_a_build(tmp_path,
                                                                                  caplog):
    caplog.set_level(logging.INFO, logger="node.learner.tiny_model")
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache's parent should be")
    a = ensure_embedded(tmp_path / "a" / "base", cache=blocked / "cache")
    assert "cannot keep the embedded model in the cache" in caplog.text
    cache = tmp_path / "cache"
    b = ensure_embedded(tmp_path / "b" / "base", cache=cache)  # built, then kept
    (kept,) = cache.iterdir()
    assert kept.name.startswith("embedded-") and "copied from the cache" not in caplog.text
    c = ensure_embedded(tmp_path / "c" / "base", cache=cache)
    assert f"copied from the cache {kept}" in caplog.text
    assert _files(a) == _files(b) == _files(c) == _files(kept)
    assert "model.safetensors" in _files(c)
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".base-")]
