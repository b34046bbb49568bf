"""The ATTENTION tab of TensorBoard: a dynamic TensorBoard plugin shipped inside gptmini.

``summary``: the compact attention summaries a run writes at each validation (torch-free, so TensorBoard starts
fast); ``plugin``: the TensorBoard backend (JSON routes) and its loader, registered through the
``tensorboard_plugins`` entry point; ``static/``: the tab itself, one ES module, no build step."""

PLUGIN_NAME = "gptmini_attention"
