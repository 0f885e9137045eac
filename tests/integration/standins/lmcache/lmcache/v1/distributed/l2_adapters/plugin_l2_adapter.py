"""Stand-in for how LMCache's MP server builds a "plugin" L2 adapter
(plugin_l2_adapter._create_plugin_adapter) and a "native_plugin" one
(native_plugin_l2_adapter._create_native_plugin_l2_adapter): import module_path, take
class_name, check it, construct it with adapter_params (and l1_memory_desc for a plugin)."""

import importlib

from .base import L2AdapterInterface

NATIVE_REQUIRED = ("event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists",
                   "drain_completions", "close")


def create_plugin_adapter(config, l1_memory_desc=None):
    assert config["type"] == "plugin"
    module = importlib.import_module(config["module_path"])
    cls = getattr(module, config["class_name"])
    if not (isinstance(cls, type) and issubclass(cls, L2AdapterInterface)):
        raise TypeError(f"{config['class_name']} is not an L2AdapterInterface")
    cfg_cls = getattr(module, config["class_name"] + "Config", None)
    if cfg_cls is not None:
        raise TypeError("this stand-in covers the raw-dict plugins only")
    kwargs = {}
    if l1_memory_desc is not None:
        kwargs["l1_memory_desc"] = l1_memory_desc
    return cls(config.get("adapter_params", {}), **kwargs)


def create_native_plugin_client(config):
    assert config["type"] == "native_plugin"
    module = importlib.import_module(config["module_path"])
    client = getattr(module, config["class_name"])(**config.get("adapter_params", {}))
    for m in NATIVE_REQUIRED:
        if not callable(getattr(client, m, None)):
            client.close()
            raise TypeError(f"missing {m}")
    return client
