"""Pure builders behind the Pulumi program in `infra/`.

Everything here is plain Python (no Pulumi import): stack config validation, Kubernetes objects
and the shell scripts the components run. Keeping it Pulumi-free is what lets
`gym-substrate render` work on a machine without the Pulumi extra and lets the tests check every
object and script without mocks.
"""

from __future__ import annotations

__all__: list[str] = []
