"""Where the keys of ``privacy.secure_aggregation: he`` come from: FLARE's provisioning, and the rehearsals'.

Production: the FLARE admin provisions the system with NVIDIA FLARE's ``HEBuilder``
(``nvflare.lighter.impl.he.HEBuilder``, listed before ``SignatureBuilder`` in ``project.yml``).
It writes ``server_context.tenseal`` (the CKKS parameters and relinearisation keys, no secret
key) into the server's startup kit and ``client_context.tenseal`` (with the secret key, the same
for every client) into each client's; the signature builder signs them. The server and each site
load their file through FLARE's security content service (:func:`server_context`,
:func:`site_context`), which refuses an unsigned or altered file in a signed kit.

Rehearsals on one machine (``fedcxr flare simulate|poc``): fedcxr makes the two files once per
run with the same ``HEBuilder`` and keeps them in ``RUN_DIR/flare/he/`` (:func:`rehearsal_keys`,
mode 0600), so a resumed run opens the checkpoints it sealed before and the runner can open the
final model afterwards. The simulator gives every participant one shared ``startup`` folder
(:func:`plant_simulator_contexts`): there the server's folder holds the client key too — the
simulator rehearses the protocol and measures its cost, it separates nothing. POC mode
provisions real kits: :class:`KeptHEBuilder` writes the kept files through FLARE's provisioning,
signed, the secret key into the clients' kits only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fedcxr.flare.sealing import SealError, check_context

#: FLARE's file names (``nvflare.lighter.constants.ProvFileName``)
SERVER_CONTEXT = "server_context.tenseal"
CLIENT_CONTEXT = "client_context.tenseal"
#: the rehearsal keys' folder inside ``RUN_DIR/flare``
REHEARSAL_DIR = "he"
#: a context file larger than this is not read (FLARE's default context: 160 KB client, 660 KB server)
MAX_CONTEXT_BYTES = 256 << 20
TENSEAL_HINT = "privacy.secure_aggregation: he needs TenSEAL: pip install 'fedcxr[he]' (the tenseal package)"


def have_tenseal() -> bool:
    try:
        import tenseal  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- loading, as FLARE loads them


def server_context(fl_ctx):
    """The server's public context from its startup kit, by FLARE's own loader (signature checked in secure mode)."""
    from nvflare.app_opt.he.homomorphic_encrypt import load_tenseal_context_from_workspace

    try:
        context = load_tenseal_context_from_workspace(SERVER_CONTEXT, fl_ctx)
    except ValueError as exc:
        raise SealError(f"the server cannot load {SERVER_CONTEXT} from its startup kit ({exc}): missing, altered or "
                        "not signed by the system's provisioning, which must include "
                        "nvflare.lighter.impl.he.HEBuilder (README 'Secure aggregation')") from None
    check_context(context, private=False, what=f"the server's {SERVER_CONTEXT}")
    return context


def site_context():
    """This site's secret context from its startup kit, by FLARE's own loader.

    The client script has no ``FLContext`` of FLARE's; the secure mode is the kit's own: a kit with
    a signature file and a root certificate (every provisioned kit) must hold a signed context."""
    from nvflare.apis.fl_constant import FLContextKey
    from nvflare.apis.fl_context import FLContext
    from nvflare.app_opt.he.homomorphic_encrypt import load_tenseal_context_from_workspace
    from nvflare.fuel.sec.security_content_service import SecurityContentService

    manager = SecurityContentService.security_content_manager
    if manager is None:
        raise SealError("no FLARE startup kit in this process: a site opens and seals models with the "
                        f"{CLIENT_CONTEXT} of its FLARE startup kit")
    fl_ctx = FLContext()
    fl_ctx.set_prop(FLContextKey.SECURE_MODE, bool(getattr(manager, "valid_config", False)), private=True,
                    sticky=False)
    try:
        context = load_tenseal_context_from_workspace(CLIENT_CONTEXT, fl_ctx)
    except ValueError as exc:
        raise SealError(f"this site cannot load {CLIENT_CONTEXT} from its startup kit ({exc}): missing, altered or "
                        "not signed by the system's provisioning, which must include "
                        "nvflare.lighter.impl.he.HEBuilder") from None
    check_context(context, private=True, what=f"this site's {CLIENT_CONTEXT}")
    return context


def read_context_file(path: Path, *, private: bool):
    """A context from a file the user names (``fedcxr flare decrypt --context``); size bounded first."""
    import tenseal as ts

    path = Path(path)
    if not path.is_file():
        raise SealError(f"{path}: no such file (a client's {CLIENT_CONTEXT} from its FLARE startup kit)")
    if path.stat().st_size > MAX_CONTEXT_BYTES:
        raise SealError(f"{path}: {path.stat().st_size} bytes is too large for a TenSEAL context")
    try:
        context = ts.context_from(path.read_bytes())
    except Exception as exc:
        raise SealError(f"{path}: not a TenSEAL context ({type(exc).__name__})") from None
    check_context(context, private=private, what=str(path))
    return context


# --------------------------------------------------------------------------- rehearsals on one machine


def rehearsal_keys(folder: Path) -> Path:
    """``folder`` holding both context files: kept when they are there, else made by FLARE's ``HEBuilder``."""
    folder = Path(folder)
    if (folder / CLIENT_CONTEXT).is_file() and (folder / SERVER_CONTEXT).is_file():
        return folder
    from nvflare.lighter.impl.he import HEBuilder

    builder = HEBuilder()  # FLARE's defaults: poly 8192, coeff [60, 40, 40], scale 2^40
    builder.initialize(None, None)  # makes the context; the project is not read
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    for name, is_client in ((CLIENT_CONTEXT, True), (SERVER_CONTEXT, False)):
        tmp = folder / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(builder.get_serialized_context(is_client=is_client))
        os.replace(tmp, folder / name)
    return folder


def plant_simulator_contexts(keys: Path, workspace: Path) -> None:
    """Put both files in the simulator's ``startup`` folder, which it copies to every participant
    (the simulator keeps ``<workspace>/startup`` through its workspace cleanup)."""
    startup = Path(workspace) / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    for name in (SERVER_CONTEXT, CLIENT_CONTEXT):
        shutil.copyfile(Path(keys) / name, startup / name)
        os.chmod(startup / name, 0o600)


try:
    from nvflare.lighter.impl.he import HEBuilder as _HEBuilder
except ImportError:  # pragma: no cover - without tenseal (or nvflare) the POC builder is not needed
    _HEBuilder = object


class KeptHEBuilder(_HEBuilder):
    """FLARE's ``HEBuilder`` writing the kept rehearsal contexts instead of new ones (POC mode: a resumed
    run must open what it sealed before). ``build`` is FLARE's: the server's kit gets the public
    context, each client's the secret one; ``SignatureBuilder`` (after it in the project) signs them."""

    def __init__(self, keys_dir: str):
        super().__init__()
        self.keys_dir = str(keys_dir)

    def initialize(self, project, ctx) -> None:
        for name in (CLIENT_CONTEXT, SERVER_CONTEXT):
            if not (Path(self.keys_dir) / name).is_file():
                raise FileNotFoundError(f"{Path(self.keys_dir) / name} is missing")

    def get_serialized_context(self, is_client: bool = False) -> bytes:
        return (Path(self.keys_dir) / (CLIENT_CONTEXT if is_client else SERVER_CONTEXT)).read_bytes()


#: the dotted path a POC project names (``fedcxr.flare.poc.write_project``)
KEPT_BUILDER_PATH = "fedcxr.flare.he_keys.KeptHEBuilder"

__all__ = ["CLIENT_CONTEXT", "KEPT_BUILDER_PATH", "KeptHEBuilder", "REHEARSAL_DIR", "SERVER_CONTEXT", "TENSEAL_HINT",
           "have_tenseal", "plant_simulator_contexts", "read_context_file", "rehearsal_keys", "server_context",
           "site_context"]
