"""The server over stage 07's workers (`serve --disaggregated`): a remote engine client and its start-up."""
