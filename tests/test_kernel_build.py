"""The C++ kernel's build folders: one per build configuration, never rebuilt by another.

Environments beside each other (other compiler flags, another torch) used to share one
build folder under one name, each rewriting its build file and recompiling in turn. Here
two fake configurations stand for two environments; the compiler is replaced by a stub
that counts builds, so no test waits on a real compile.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from bamctl.engine import native


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """A private build root, and a stub compiler recording the configurations it built."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    built = []

    def compile_stub(config):
        config.folder().mkdir(parents=True, exist_ok=True)
        config.library().write_bytes(b"stub library")
        built.append(config)
        return ("compiled", config.name)

    monkeypatch.setattr(native, "_compile", compile_stub)
    monkeypatch.setattr(native, "_import_built", lambda config: ("imported", config.name))
    return built


def fake(config: native.BuildConfig, **changes) -> native.BuildConfig:
    return dataclasses.replace(config, **changes)


def test_two_configurations_keep_their_own_builds(builds):
    base = native.BuildConfig.current()
    plain = fake(base, cflags=("-O3", "-fopenmp"))
    vector = fake(base, cflags=("-O3", "-fopenmp", "-mavx2", "-mfma"))
    assert plain.folder() != vector.folder()

    assert native.load_kernel(plain) == ("compiled", plain.name)
    assert native.load_kernel(vector) == ("compiled", vector.name)
    # Each environment again, in turn: both builds are found as they were, neither is redone.
    for _ in range(2):
        assert native.load_kernel(plain) == ("imported", plain.name)
        assert native.load_kernel(vector) == ("imported", vector.name)
    assert builds == [plain, vector]
    assert json.loads((plain.folder() / native.STAMP).read_text())["cflags"] == ["-O3", "-fopenmp"]


def test_a_torch_upgrade_or_a_source_edit_builds_anew(builds):
    base = native.BuildConfig.current()
    native.load_kernel(base)
    upgraded = fake(base, torch_version=base.torch_version + ".post1")
    edited = fake(base, source_sha256="0" * 64)
    native.load_kernel(upgraded)
    native.load_kernel(edited)
    assert builds == [base, upgraded, edited]
    assert len({c.folder() for c in builds}) == 3


def test_a_build_without_its_stamp_is_built_again(builds):
    # A library with no stamp is one a killed build may have left half written.
    config = native.BuildConfig.current()
    config.folder().mkdir(parents=True)
    config.library().write_bytes(b"half written")
    assert not config.built()
    assert native.load_kernel(config) == ("compiled", config.name)
    assert config.built()


def test_a_damaged_library_is_built_again(builds, monkeypatch):
    config = native.BuildConfig.current()
    native.load_kernel(config)

    def broken(config):
        raise ImportError("invalid ELF header")

    monkeypatch.setattr(native, "_import_built", broken)
    assert native.load_kernel(config) == ("compiled", config.name)
    assert builds == [config, config]


def test_the_configuration_names_the_source_by_contents_not_by_path(tmp_path, monkeypatch):
    # Two checkouts of the same code in other places share one build.
    copy = tmp_path / "elsewhere" / "bam_attention.cpp"
    copy.parent.mkdir()
    copy.write_bytes(native.SOURCE.read_bytes())
    here = native.BuildConfig.current()
    monkeypatch.setattr(native, "SOURCE", copy)
    assert native.BuildConfig.current() == here


def test_availability_of_a_finished_build_does_not_load_it(builds, monkeypatch):
    # A run that skips every sample asks whether the kernel can run; it must not load it for that.
    config = native.BuildConfig.current()
    native.load_kernel(config)
    loaded = []
    monkeypatch.setattr(native, "_import_built", lambda c: loaded.append(c))
    native.native_available.cache_clear()
    try:
        assert native.native_available() == (True, "")
    finally:
        native.native_available.cache_clear()
    assert loaded == [] and builds == [config]


@pytest.mark.skipif(not native.native_available()[0], reason="no C++ toolchain to build the kernel here")
def test_the_real_kernel_lives_in_its_configurations_folder():
    config = native.BuildConfig.current()
    assert native._extension() is not None and not isinstance(native._extension(), str)
    assert config.built() and config.library().parent.name == config.name
