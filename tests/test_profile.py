"""Machine profiles (planning/profile.py): loading, and the planner following them."""

import json

import pytest

import mpiredist as mr
from mpiredist.planning import profile as profiles
from mpiredist.planning.profile import DEFAULT, Profile

CASE = ((4096, 4096), "float32", {"x": 2, "y": 4}, "[{x,y}, {}]", "[{y}, {x}]")   # c04


def _ops(p):
    return [s.op for s in p.steps]


def test_two_profiles_flip_the_choice():
    fast_exchange = Profile(beta=(("exchange", 1, 50e9),), pack_rate=1e18, source="A")
    slow_exchange = Profile(beta=(("exchange", 1, 1e9),), pack_rate=1e18, source="B")
    a = mr.plan(*CASE, profile=fast_exchange)
    b = mr.plan(*CASE, profile=slow_exchange)
    assert _ops(a) == ["exchange"] and "predicted" in a.note and "(A)" in a.note
    assert "exchange" not in _ops(b) and b.bytes_sent_per_rank > a.bytes_sent_per_rank
    # latency decides too: many cheap messages against one expensive round
    many = Profile(alpha=1.0, beta=(("exchange", 1, 1e12),), pack_rate=1e18)
    assert mr.plan(*CASE, profile=many).steps  # still a plan within the bound
    assert mr.plan(*CASE, profile=many).peak_local_bytes <= 32 << 20


def test_profile_from_env_and_file(tmp_path, monkeypatch):
    doc = {"version": 1, "alpha": 1e-6, "beta": {"exchange": {"8": 1e9}, "all_to_all": {"2": 1e10}},
           "pack_rate": 1e18, "datatype_rate": 1e9, "memory_bandwidth": 1e11, "ranks": 8}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(profiles.ENV, str(path))
    got = profiles.current()
    assert got.beta_for("exchange", 8) == 1e9 and got.beta_for("all_to_all", 4) == 1e10
    assert got.beta_for("all_to_all", 1) == 1e10           # below the smallest: the smallest
    assert got.beta_for("permute", 8) == got.default_beta  # not measured: the default
    assert "exchange" not in _ops(mr.plan(*CASE))           # planned with the file's figures
    assert Profile.from_dict(got.to_dict(), "again") == got
    monkeypatch.setenv(profiles.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="no such profile"):
        profiles.current()
    path.write_text(json.dumps({"alpha": 1}))
    monkeypatch.setenv(profiles.ENV, str(path))
    with pytest.raises(ValueError, match="not a calibrate profile"):
        profiles.current()


def test_default_profile_without_file(tmp_path, monkeypatch):
    monkeypatch.delenv(profiles.ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert profiles.current() is DEFAULT
    assert profiles.default_path() == tmp_path / "mpiredist" / "profile.json"
    assert _ops(mr.plan(*CASE)) == ["exchange"]      # 33 % fewer bytes: as before profiles
