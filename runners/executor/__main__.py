"""``python -m runners.executor FD TARGET [ARGUMENT_FILE]``: a zygote (runners.executor.zygote), started by its
worker. A module of its own, which the package never imports, so that the zygote's module is loaded once."""
from .zygote import main

main()
