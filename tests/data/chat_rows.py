"""Chat rows shared by the encoder tests."""

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
MIXED = [  # a plain chat and a tool-calling one, each message with only its own keys
    {"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"}]},
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [CALL]},
            {"role": "tool", "name": "get_weather", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    },
]
