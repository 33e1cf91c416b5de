"""The FLARE client script of every fedcxr job (FLARE copies it into each site's app and runs it).

Kept to one call so that jobs do not depend on where fedcxr's modules live: the work is done by
:func:`fedcxr.flare.client.main` of the fedcxr installed at the hospital.
"""

from fedcxr.flare.client import main

if __name__ == "__main__":
    main()
