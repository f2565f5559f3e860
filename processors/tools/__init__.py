"""The `agui-stream` command (`cli`): the offline checker (`checker`), the demo (`demo`,
with its bundled `samples`), and the worker and topic commands of the runtime."""
