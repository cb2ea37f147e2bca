"""The GRUB menus as text: the A/B slot menu's state handling and the environment block format.

GRUB itself runs these menus in the end-to-end tests (tests/e2e/test_slots.py boots a disk
whose trial slot fails and falls back, on BIOS and UEFI); here is what the text must say.
"""

from __future__ import annotations

import re

import pytest

from kiln.image.outputs.grub import MAX_TRIES, environment_block, slots_config


def test_only_the_state_variables_are_loaded_and_saved() -> None:
    menu = slots_config()
    assert "load_env kiln_default kiln_next kiln_tries kiln_rollback kiln_version_A kiln_version_B\n" in menu
    assert "    save_env kiln_next kiln_tries kiln_rollback\n" in menu
    assert menu.count("load_env") == 1 and menu.count("save_env") == 1
    assert "--file" not in menu  # the block next to grub.cfg ($prefix/grubenv), nowhere else


def test_a_trial_slot_costs_one_try_per_boot_then_rolls_back() -> None:
    menu = slots_config()
    steps = re.findall(
        r'\[ "\$kiln_tries" = "(\d)" \]; then\n\s+set kiln_tries="(\d)"\n\s+set kiln_slot="\$kiln_next"', menu
    )
    assert [(int(a), int(b)) for a, b in steps] == [(n, n - 1) for n in range(MAX_TRIES, 0, -1)]
    rollback = menu.split("    else\n", 1)[1].split("    fi\n", 1)[0]
    assert 'set kiln_rollback="$kiln_next"' in rollback and 'set kiln_next=""' in rollback
    # The try is saved before any kernel runs: the entries come after the state handling.
    assert menu.index("save_env") < menu.index("menuentry")


def test_the_other_slot_is_the_fallback_entry() -> None:
    """Entry 0 boots the chosen slot, entry 1 (when the other slot has a boot.cfg) the other one."""
    menu = slots_config()
    assert "set default=0\nset fallback=1\n" in menu
    entries = re.findall(r'menuentry "([^"]+)"', menu)
    assert entries == [
        "Kiln $kiln_this_version, slot $kiln_slot",
        "Kiln $kiln_other_version, slot $kiln_other (the other slot)",
    ]


def test_slot_names_from_the_block_are_a_or_b_only() -> None:
    menu = slots_config()
    assert 'if [ "$kiln_default" != "B" ]; then set kiln_default="A"; fi' in menu
    assert 'if [ "$kiln_next" != "A" -a "$kiln_next" != "B" ]; then set kiln_next=""; fi' in menu


def test_environment_block_is_grubs_format() -> None:
    block = environment_block({"kiln_default": "B", "kiln_next": "A", "kiln_tries": "3"})
    assert len(block) == 1024
    text = b"# GRUB Environment Block\nkiln_default=B\nkiln_next=A\nkiln_tries=3\n"
    assert block.startswith(text)
    assert set(block[len(text) :]) == {ord("#")}


@pytest.mark.parametrize("value", ["x\ny", "a\\b", "v" * 1100])
def test_environment_block_refuses_what_it_cannot_hold(value: str) -> None:
    with pytest.raises(ValueError, match="GRUB environment block"):
        environment_block({"kiln_default": value})
