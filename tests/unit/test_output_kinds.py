"""The output kinds' one registry (kiln.image.outputs.kinds): the profile schema agrees with it, and every
kind's writer is a module of kiln.image.outputs with a write()."""

from __future__ import annotations

import importlib
import inspect
import json
from importlib.resources import files

from kiln.image.outputs.kinds import KINDS, kinds_where
from kiln.image.profile_rules import BOOTED_KINDS, SECUREBOOT_KINDS


def test_the_schema_enum_is_the_registrys_kinds_in_its_order() -> None:
    schema = json.loads((files("kiln.image") / "profile.schema.json").read_text())
    kind = schema["properties"]["output"]["properties"]["kind"]
    assert kind["enum"] == list(KINDS)
    assert kind["x-message"] == f"output kind '{{value}}' is not one of {', '.join(KINDS)}"


def test_every_kind_has_a_writer_module_with_write() -> None:
    for name, kind in KINDS.items():
        assert kind.name == name
        module = importlib.import_module(kind.module)
        assert kind.module.startswith("kiln.image.outputs."), name
        parameters = list(inspect.signature(module.write).parameters)
        assert parameters == ["profile", "assets", "dest", "trees"], name


def test_the_rules_kinds_come_from_the_registry() -> None:
    assert BOOTED_KINDS == kinds_where(boot="loader") == ("iso", "image", "pxe", "installer")
    assert SECUREBOOT_KINDS == kinds_where(secureboot=True) == ("iso", "image", "installer")
    assert [name for name, kind in KINDS.items() if kind.grouped] == ["pxe"]
