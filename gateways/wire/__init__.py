"""How gateway decisions map onto protocol frames: round messages between gateways, configuration updates
for trainers."""
