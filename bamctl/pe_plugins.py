"""Positional encodings of the user's own, found by reference: a file (``FILE.py:CLASS``), a module
(``package.module:CLASS``) or an installed package's entry point, wherever a PE is named.

The zoo and the protocol every PE meets live in ``bamctl.positional``; finding code by where it
lives, in ``bamctl.plugins``. Here a PE's name becomes its class: a zoo entry, or a plugin found,
checked against the protocol and recorded (where it was found, the digest of its code), so a
checkpoint can find it again, and runs it only with the user's consent (``bamctl.consent``).
"""

from __future__ import annotations

from pathlib import Path

from bamctl.errors import BamctlError, did_you_mean
from bamctl.positional import PE_REGISTRY, SSMAX_SUFFIX, PESpec, check_plugin

PLUGIN_GROUP = "bamctl.positional_encodings"  # entry points of installed packages: name = "package.module:Class"


def parse_pe_name(name: str) -> tuple[str, bool]:
    """``"bam-ssmax"`` -> ``("bam", True)``; a plugin's reference (``./my_pe.py:Sandwich-ssmax``) is
    found and checked against the PE protocol; unknown names raise with close matches."""
    base, ssmax = (name[: -len(SSMAX_SUFFIX)], True) if name.endswith(SSMAX_SUFFIX) else (name, False)
    if base not in PE_REGISTRY:
        if is_plugin_reference(base):
            pe_spec(base)  # found and checked now, one line if not
            return base, ssmax
        plugins = list(installed_plugins())
        choices = [*PE_REGISTRY, *plugins, *(f"{n}{SSMAX_SUFFIX}" for n in [*PE_REGISTRY, *plugins])]
        raise BamctlError(f"unknown positional encoding {name!r}{did_you_mean(name, choices)} (a plugin of your own: "
                          "FILE.py:CLASS or package.module:CLASS, docs/positional-plugins.md)")
    return base, ssmax


def is_plugin_reference(name: str) -> bool:
    return ":" in name or name in installed_plugins()


def installed_plugins() -> dict:
    from bamctl.plugins import entry_points

    return entry_points(PLUGIN_GROUP)


def pe_spec(name: str, source: dict | None = None) -> PESpec:
    """The PE ``name`` names: a zoo entry, or a plugin found by reference. ``source`` is what a
    checkpoint recorded of its plugin (where it was found, the digest of its code then): code a
    checkpoint names runs only with the user's consent (``bamctl.consent``), and only when its
    bytes are still those recorded, both checked before anything of it is imported."""
    if name in PE_REGISTRY:
        return PE_REGISTRY[name]
    return _plugin_spec(name, source)


def _plugin_spec(name: str, recorded: dict | None) -> PESpec:
    from bamctl import consent
    from bamctl.plugins import file_digest_or_none, is_file_target, load, load_entry_point, local_code_of

    who = f"positional encoding {name}"
    where = recorded.get("where") if recorded else None
    reference = where or name
    if where and is_file_target(where.rpartition(":")[0]) and not Path(where.rpartition(":")[0]).is_file():
        # a checkpoint from another machine or folder: its plugin by the name it was given, from here
        given = name.rpartition(":")[0]
        if not (is_file_target(given) and Path(given).expanduser().is_file()):
            raise BamctlError(f"{who}: its file is neither where the checkpoint found it ({where.rpartition(':')[0]}) "
                              f"nor at {given} from here; put it back, or run from the folder it was named from")
        reference = name
    target, sep, attribute = reference.rpartition(":")
    point = None if sep else installed_plugins().get(reference)
    if not sep and point is None:
        raise BamctlError(f"{who}: no installed package gives it (entry point group {PLUGIN_GROUP}); install the "
                          "package that does, or name its file as FILE.py:CLASS")
    code = local_code_of(target if sep else point.module)  # an entry point's package on the path is the user's code too
    if code is not None and recorded is not None:
        if recorded.get("digest") not in (None, code.digest):
            raise BamctlError(f"{who}: {code.describe()} in {code.root} is not the code this checkpoint was made "
                              f"with (its digest {code.digest}, recorded {recorded['digest']}); restore those "
                              "files, or make a new checkpoint")
        consent.require(code, who)
    elif code is not None:
        consent.named(code)
    found = load(target, attribute, who) if sep else load_entry_point(PLUGIN_GROUP, reference, who)
    cls = found.value
    check_plugin(cls, who)
    digest_now = code.digest if code is not None else file_digest_or_none(found.source)
    if recorded is not None and recorded.get("digest") is not None and digest_now != recorded["digest"]:
        raise BamctlError(f"{who}: {found.source} is not the source this checkpoint was made with (its digest "
                          f"{digest_now or 'none'}, recorded {recorded['digest']}); restore that file, or make a new checkpoint")
    summary = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
    source = {"where": found.where, "digest": digest_now, "text": found.source_text}
    if code is not None and len(code.files) > 1:
        source["files"] = dict(code.files)  # the helpers it imports, by path from its folder
    return PESpec(name, summary, cls, source=source)
