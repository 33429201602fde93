"""The stack model: everything a gym-substrate Pulumi stack is made of, in one package.

Pulumi-free (importable without the `infra` extra, which is what lets `gym-substrate render`
run on a machine without Pulumi, and what lets the tests check every object and script without
mocks):

- `config`: the validated stack configuration, read from `Pulumi.<stack>.yaml`;
- `objects`: the Kubernetes objects the stack applies, as plain dicts;
- `scripts`: the shell steps the components run, as plain strings, and how their results are
  read back;
- `host`: the borrowed host's steps: record it, prepare it, put it back;
- `bundle`: the offline tool folder install-tools installs from on an air-gapped host;
- `render`: writes a stack's objects and scripts to a folder.

Pulumi (imported only by the Pulumi program in `infra/__main__.py`, never by this package):

- `runner`: where a stack's shell steps run, this machine or a borrowed host over SSH;
- `components`: the Pulumi components that wire those objects and steps into resources.
"""

from __future__ import annotations

__all__: list[str] = []
