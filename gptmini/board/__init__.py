"""The ATTENTION tab of TensorBoard: a dynamic TensorBoard plugin shipped inside gptmini, registered through the
``tensorboard_plugins`` entry point (docs/attention-tab.md, "For developers")."""

PLUGIN_NAME = "gptmini_attention"
