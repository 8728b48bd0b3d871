"""The operator console (GATEWAY_CONSOLE_PORT): pages, actions and logins."""
