"""The Dockerfile/compose reader the deploy tests rely on reads what Docker would."""

from __future__ import annotations

import pytest

from tests.deploy.container import host_paths
from tests.deploy.dockerfile import compose_vars, interpolate, parse_dockerfile

DOCKERFILE = """\
ARG BASE=python:3.11-slim
FROM ${BASE} AS one
ENV A=1
ENV B=$A/x \\
    # a comment inside a continued instruction
    D=$UNKNOWN
ENTRYPOINT ["a"]
CMD ["b"]
USER 5
FROM one AS two
ENV A=2 C=${B}:$A
ENTRYPOINT ["c", "d"]
HEALTHCHECK --interval=5s CMD ["check", "--x"]
VOLUME ["/v"]
EXPOSE 1/tcp 2/udp
"""


def test_stages_inherit_config_and_substitute_env(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(DOCKERFILE)
    stages = parse_dockerfile(path)
    one, two = stages["one"], stages["two"]
    assert one.base == "python:3.11-slim" and stages[""] is two
    assert one.image.env == {"A": "1", "B": "1/x", "D": "$UNKNOWN"}  # e.g. the base's $PATH
    assert two.image.env == {"A": "2", "B": "1/x", "C": "1/x:1", "D": "$UNKNOWN"}  # values from before the ENV line
    assert (one.image.entrypoint, one.image.cmd) == (["a"], ["b"])
    assert (two.image.entrypoint, two.image.cmd) == (["c", "d"], None)  # ENTRYPOINT resets CMD
    assert two.image.user == "5" and two.image.volumes == ["/v"]
    assert two.image.expose == ["1/tcp", "2/udp"]
    assert two.image.healthcheck == {"options": {"interval": "5s"}, "cmd": ["check", "--x"]}


def test_shell_form_entrypoint_is_refused(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text("FROM x\nENTRYPOINT swarm-node join\n")
    with pytest.raises(ValueError):
        parse_dockerfile(path)


def test_compose_interpolation_forms():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET}-${UNSET:-d}-${EMPTY:-d}-${EMPTY-d}-$$X-$SET", env) == "v-d-d--$X-v"
    with pytest.raises(KeyError, match="NEEDED"):
        interpolate({"k": ["${NEEDED:?say why}"]}, env)
    assert interpolate("${EMPTY?ok}", env) == ""
    assert compose_vars({"a": ["${X:-1}", "$Y", "$$Z"], "b": 3}) == {"X", "Y"}


def test_host_paths_only_replace_whole_path_components():
    paths = {"/data": "/tmp/d", "/opt/venv": "/v"}
    assert host_paths("/data", paths) == "/tmp/d"
    assert host_paths("/data/hf-cache", paths) == "/tmp/d/hf-cache"
    assert host_paths("/opt/venv/bin:$PATH", paths) == "/v/bin:$PATH"
    assert host_paths("/database", paths) == "/database"
    assert host_paths("/x/data", paths) == "/x/data"
    assert host_paths("/ip4/0.0.0.0/tcp/4001", paths) == "/ip4/0.0.0.0/tcp/4001"
