// VS Code client for memlsp: starts `memlsp lsp` on stdio and lets vscode-languageclient do the
// rest (diagnostics, inlay hints, hovers, code actions, the server's commands).
//
// Server binary: `memlsp.server.path` → the binary bundled in bin/ (platform VSIX) → `memlsp` on
// PATH. Settings: the server pulls the `memlsp` section through workspace/configuration and is
// told about changes. The server scans and watches the workspace for captures itself.
import * as fs from "fs";
import * as path from "path";
import * as vscode from "vscode";
import {
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from "vscode-languageclient/node";

let client: LanguageClient | undefined;
let output: vscode.OutputChannel | undefined;

/** Where the server binary is, and why that one. */
export function resolveServer(ctx: vscode.ExtensionContext): { command: string; from: string } {
  const cfg = vscode.workspace.getConfiguration("memlsp");
  const configured = cfg.get<string | null>("server.path");
  // In an untrusted workspace a workspace-level server.path is not honoured (restrictedConfigurations).
  if (configured && configured.trim() !== "") {
    return { command: configured, from: "memlsp.server.path" };
  }
  const exe = process.platform === "win32" ? "memlsp.exe" : "memlsp";
  const bundled = ctx.asAbsolutePath(path.join("bin", exe));
  if (fs.existsSync(bundled)) {
    if (process.platform !== "win32") {
      try {
        fs.accessSync(bundled, fs.constants.X_OK);
      } catch {
        // Some unpackers drop the executable bit.
        try {
          fs.chmodSync(bundled, 0o755);
        } catch {
          /* reported when the start fails */
        }
      }
    }
    return { command: bundled, from: "bundled with the extension" };
  }
  return { command: exe, from: "PATH" };
}

function makeClient(ctx: vscode.ExtensionContext, out: vscode.OutputChannel): LanguageClient {
  const { command, from } = resolveServer(ctx);
  out.appendLine(`memlsp: starting ${command} lsp (${from})`);
  // No `transport`: stdio is the default, and TransportKind.stdio would append `--stdio`, which
  // `memlsp lsp` rejects (exit status 2).
  const serverOptions: ServerOptions = {
    run: { command, args: ["lsp"] },
    debug: { command, args: ["lsp"] },
  };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file", language: "python" }],
    // Push model for settings changes: didChangeConfiguration carries the `memlsp` section.
    synchronize: { configurationSection: "memlsp" },
    outputChannel: out,
    traceOutputChannel: out,
  };
  // The id `memlsp` makes languageclient honour the `memlsp.trace.server` setting.
  return new LanguageClient("memlsp", "memlsp", serverOptions, clientOptions);
}

async function start(ctx: vscode.ExtensionContext): Promise<void> {
  if (!output) {
    output = vscode.window.createOutputChannel("memlsp");
    ctx.subscriptions.push(output);
  }
  client = makeClient(ctx, output);
  try {
    await client.start();
  } catch (e) {
    const msg = e instanceof Error ? e.message : String(e);
    output.appendLine(`memlsp: the server did not start: ${msg}`);
    const pick = await vscode.window.showErrorMessage(
      `memlsp: the server did not start (${msg}). Set memlsp.server.path or put memlsp on PATH.`,
      "Open Settings",
      "Show Output",
    );
    if (pick === "Open Settings") {
      await vscode.commands.executeCommand("workbench.action.openSettings", "memlsp.server.path");
    } else if (pick === "Show Output") {
      output.show(true);
    }
  }
}

async function stop(): Promise<void> {
  const c = client;
  client = undefined;
  if (c && c.state !== State.Stopped) {
    await c.stop();
  }
}

export async function activate(ctx: vscode.ExtensionContext): Promise<void> {
  // Client-side commands live in their own ids. The server's commands (memlsp.reanalyze,
  // memlsp.explain) are registered by vscode-languageclient from executeCommandProvider;
  // registering them here as well makes the client fail to start ("command already exists").
  ctx.subscriptions.push(
    vscode.commands.registerCommand("memlsp.restartServer", async () => {
      await stop();
      await start(ctx);
    }),
    vscode.commands.registerCommand("memlsp.showOutput", () => output?.show(true)),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration("memlsp.server.path")) {
        await stop();
        await start(ctx);
      }
    }),
  );
  await start(ctx);
}

export async function deactivate(): Promise<void> {
  await stop();
}
