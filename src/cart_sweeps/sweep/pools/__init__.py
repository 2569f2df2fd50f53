"""The pools a stage can run on, each named by a launcher config's `_target_` (conf/launcher/)."""
