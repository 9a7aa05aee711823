"""Stand-in for vllm/utils/func_utils.py: supports_kw, the check vLLM's connector factory
runs on an external connector class.

Reproduces vllm-project/vllm vllm/utils/func_utils.py @ 01e4fce07423dafcc832600ba05159fb28dc1126
(_supports_kw / supports_kw), minus the lru_cache.
"""

import inspect
from typing import Any, Callable


def supports_kw(
    callable: Callable[..., object],
    kw_name: str,
    *,
    requires_kw_only: bool = False,
    allow_var_kwargs: bool = True,
) -> bool:
    if hasattr(callable, "__func__"):
        callable = callable.__func__  # type: ignore[attr-defined]
    params = inspect.signature(callable).parameters
    if not params:
        return False
    param_val = params.get(kw_name)
    passable_kw_types = {
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    }
    if param_val:
        is_sig_param = param_val.kind in passable_kw_types
        if requires_kw_only and is_sig_param and param_val.kind != inspect.Parameter.KEYWORD_ONLY:
            return False
        if (requires_kw_only and param_val.kind == inspect.Parameter.KEYWORD_ONLY) or (
            not requires_kw_only and is_sig_param
        ):
            return True
    if allow_var_kwargs:
        last_param: Any = params[next(reversed(params))]  # type: ignore[call-overload]
        return last_param.kind == inspect.Parameter.VAR_KEYWORD and last_param.name != kw_name
    return False
