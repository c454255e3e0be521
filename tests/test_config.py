"""Configuration validation, JSON round trips and the registry's shape."""

import json

import pytest

from hwgen import registry
from hwgen.errors import ConfigError


@pytest.mark.parametrize("name", registry.names())
def test_defaults_and_test_configs_are_valid(name):
    acc = registry.get(name)
    cfg = acc.config()
    assert acc.config.from_dict(cfg.to_dict()) == cfg
    assert len(acc.test_configs) >= 4, "every accelerator is simulated in >= 4 configurations"
    for values in acc.test_configs:
        acc.config.from_dict(values)


@pytest.mark.parametrize("name", registry.names())
def test_unknown_parameter_is_named(name):
    acc = registry.get(name)
    with pytest.raises(ConfigError, match=r"^bogus=.*unknown parameter"):
        acc.make_config(["bogus=3"])


@pytest.mark.parametrize("name", registry.names())
def test_json_file_round_trip(tmp_path, name):
    acc = registry.get(name)
    values = acc.test_configs[0]
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(values))
    cfg = acc.make_config([], config_file=path)
    assert {k: cfg.to_dict()[k] for k in values} == values
    # --set wins over the file
    key = next(iter(values))
    text = json.dumps(values[key]) if isinstance(values[key], list) else values[key]
    cfg2 = acc.make_config([f"{key}={text}"], config_file=path)
    assert cfg2 == cfg


def test_bad_json_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="config=.*not valid JSON"):
        registry.get("pq-decoder").make_config([], config_file=path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        registry.get("pq-decoder").make_config([], config_file=path)
    with pytest.raises(ConfigError, match="cannot read"):
        registry.get("pq-decoder").make_config([], config_file=tmp_path / "missing.json")


@pytest.mark.parametrize("text, message", [
    ("m=0", r"^m=0: must be an integer in 1\.\.64"),
    ("m=65", r"^m=65: must be an integer in 1\.\.64"),
    ("m=x", r"^m='x': must be an integer in 1\.\.64"),
    ("lut_bits=33", r"^lut_bits=33: must be an integer in 1\.\.32"),
    ("lut_buffers=3", r"^lut_buffers=3: .*1\.\.2"),
    ("forward_lut=maybe", r"^forward_lut='maybe': must be true or false"),
    ("m", r"expected key=value"),
])
def test_pq_decoder_rejects(text, message):
    with pytest.raises(ConfigError, match=message):
        registry.get("pq-decoder").make_config([text])


def test_set_parses_types():
    cfg = registry.get("pq-decoder").make_config(["m=016", "forward_lut=false", "tag_bits=7"])
    assert (cfg.m, cfg.forward_lut, cfg.tag_bits) == (16, False, 7)


@pytest.mark.parametrize("text", ["0x10", "0o20", "0b10000", "1e1", "16.0", "1_6", "", "nan"])
def test_set_integers_are_decimal_only(text):
    """No notation is reinterpreted: ``08`` is 8 and ``0x10`` is refused, not read as 16."""
    with pytest.raises(ConfigError, match=r"^m='.*': must be an integer in 1\.\.64"):
        registry.get("pq-decoder").make_config([f"m={text}"])


def test_lut_builder_cross_field_rules():
    acc = registry.get("lut-builder")
    with pytest.raises(ConfigError, match=r"^m=7: must divide dim=96 \(allowed: 1, 2, 3, 4, 6"):
        acc.make_config(["dim=96", "m=7"])
    with pytest.raises(ConfigError, match=r"^sub_par=13: must be in 0\.\.m=12"):
        acc.make_config(["dim=96", "m=12", "sub_par=13"])
    cfg = acc.make_config(["dim=96", "m=12", "sub_par=5"])
    assert (cfg.lanes, cfg.steps, cfg.dsub) == (5, 3, 8)


def test_type_errors_in_dicts():
    cls = registry.get("pq-decoder").config
    with pytest.raises(ConfigError, match="^m=True"):
        cls.from_dict({"m": True})
    with pytest.raises(ConfigError, match="^m=2.5"):
        cls.from_dict({"m": 2.5})


def test_unknown_accelerator():
    with pytest.raises(ConfigError, match=r"^accelerator='nope': unknown; choose one of: "
                                          r"pq-decoder, lut-builder"):
        registry.get("nope")


def test_digest_depends_on_every_field():
    cls = registry.get("pq-decoder").config
    base = cls()
    assert len({base.digest(), base.replace(m=17).digest(), base.replace(tag_bits=5).digest(),
                base.replace(forward_lut=False).digest()}) == 4


# -- typed structured fields -------------------------------------------------------------------

def test_structured_fields_take_their_old_text_spellings():
    """Configuration files written before the fields were typed keep working: each text form
    parses to the typed value written out by hand."""
    from hwgen.cluster.spec.adapter import PacketsToRowsConfig, Source
    from hwgen.cluster.spec.compute import ChainModule, KernelChainConfig
    from hwgen.cluster.spec.gateway import GatewayConfig, GmiGroup
    from hwgen.cluster.spec.switch import Route, SwitchConfig
    from hwgen.recsys.node import NodeConfig, Slice
    gw = GatewayConfig(groups="broadcast@9:2,5,3;scatter@12:7-8,1", local_ids="1-8")
    assert gw.groups == (GmiGroup("broadcast", 9, (2, 5, 3)), GmiGroup("scatter", 12, (7, 8, 1)))
    assert gw.local_ids == (1, 2, 3, 4, 5, 6, 7, 8)
    assert GatewayConfig(virtual="gather,reduce").virtual == ("gather", "reduce")
    assert SwitchConfig(routes="3:0,4:1").routes == (Route(3, 0), Route(4, 1))
    p2r = PacketsToRowsConfig(sources="4:field=p:lanes=3,5", fifo_depths="8,9")
    assert p2r.sources == (Source(4, field="p", lanes=3), Source(5))
    assert p2r.fifo_depths == (8, 9)
    assert NodeConfig(slices="0:0:29:16,1:0:13:8,2:0:7:2,3:0:1:1") == NodeConfig()
    chain = '[{"kind": "ibert-gelu", "params": {"row": 5, "lanes": 5}}]'
    assert KernelChainConfig(modules=chain).modules == (
        ChainModule("ibert-gelu", {"lanes": 5, "row": 5}),)


@pytest.mark.parametrize("name", ["cluster-gateway", "cluster-pkt2row", "cluster-kernel-chain"])
def test_structured_fields_round_trip_json(name):
    acc = registry.get(name)
    for values in acc.test_configs:
        cfg = acc.config.from_dict(values)
        again = acc.config.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg and again.digest() == cfg.digest()


def test_set_takes_json_for_structured_fields():
    from hwgen.cluster.spec.switch import SwitchConfig
    cfg = SwitchConfig().with_overrides(['routes=[{"kernel": 3, "port": 1}]'])
    assert cfg.to_dict()["routes"] == [{"kernel": 3, "port": 1}]
    assert SwitchConfig().with_overrides(["routes=3:1"]) == cfg
    assert SwitchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("values, where", [
    ({"routes": [{"kernel": 300, "port": 0}]}, "routes[0]"),
    ({"routes": [{"kernel": 3, "gate": 0}]}, "routes[0]"),
    ({"routes": [{"kernel": 3, "port": 9}]}, "routes[0]"),
    ({"routes": "[{"}, "routes"),
    ({"routes": 5}, "routes"),
])
def test_structured_field_errors_name_the_element(values, where):
    from hwgen.cluster.spec.switch import SwitchConfig
    with pytest.raises(ConfigError) as e:
        SwitchConfig(**values)
    assert e.value.param == where, str(e.value)
