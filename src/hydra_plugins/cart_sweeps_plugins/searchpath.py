"""The Hydra SearchPathPlugin of cart_sweeps: the user's config folders of this command, in every process.

`python -m cart_sweeps` (and plan, dashboard) keep the command's --config-dir and hydra.searchpath in the
environment (cart_sweeps.compose.use_config_sources); this plugin puts them in the search path of every
Hydra that starts under it: the driver's compositions and each job's, so a user's stage, primary config
(--config-name) or preset is found wherever the run is composed.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class CartSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from cart_sweeps.compose import searchpath

        for path in searchpath():
            search_path.append(provider="cart_sweeps", path=path)
