// VS Code client for memlsp: starts `memlsp lsp` on stdio and lets vscode-languageclient do the
// rest (diagnostics, inlay hints, hovers, code actions, code lenses, the server's commands); shows
// the server's memory timeline page in a webview (`memlsp.showTimeline`).
//
// Server binary: `memlsp.server.path` → the binary bundled in bin/ (platform VSIX) → `memlsp` on
// PATH. Settings: the server pulls the `memlsp` section through workspace/configuration and is
// told about changes. The server scans and watches the workspace for captures itself.
import * as fs from "fs";
import * as path from "path";
import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from "vscode-languageclient/node";

let client: LanguageClient | undefined;
let output: vscode.OutputChannel | undefined;
/** The open timeline pages, one per capture. */
const pages = new Map<string, vscode.WebviewPanel>();

/** What `memlsp.timeline` answers: the page the server renders (no second implementation here). */
interface TimelinePage {
  capture: string;
  title: string;
  html: string;
}

/**
 * `memlsp.showTimeline`: from the explorer (a capture's Uri), a code lens ({capture, file, line}),
 * or the palette (the line under the cursor, else the newest capture). The server analyses the
 * capture and renders the page; a click on a band in it reveals the file and line.
 */
async function showTimeline(arg?: unknown): Promise<void> {
  if (!client || client.state !== State.Running) {
    void vscode.window.showWarningMessage("memlsp: the server is not running.");
    return;
  }
  let param: Record<string, unknown> = {};
  if (arg instanceof vscode.Uri) {
    param = { capture: arg.fsPath };
  } else if (arg && typeof arg === "object" && ("capture" in arg || "file" in arg)) {
    param = arg as Record<string, unknown>;
  } else {
    const ed = vscode.window.activeTextEditor;
    if (ed && ed.document.uri.scheme === "file") {
      param = { file: ed.document.uri.toString(), line: ed.selection.active.line + 1 };
    }
  }
  let page: TimelinePage;
  try {
    page = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Window, title: "memlsp: drawing the memory timeline" },
      () =>
        client!.sendRequest(ExecuteCommandRequest.type, {
          command: "memlsp.timeline",
          arguments: [param],
        }) as Promise<TimelinePage>,
    );
  } catch (e) {
    const msg = e instanceof Error ? e.message : String(e);
    void vscode.window.showErrorMessage(`memlsp: ${msg}`);
    return;
  }
  let panel = pages.get(page.capture);
  if (panel) {
    panel.reveal(vscode.ViewColumn.Beside);
  } else {
    panel = vscode.window.createWebviewPanel(
      "memlsp.timeline",
      page.title,
      vscode.ViewColumn.Beside,
      // The page is self-contained (inline script and style, no network).
      { enableScripts: true, retainContextWhenHidden: true, localResourceRoots: [] },
    );
    const p = panel;
    pages.set(page.capture, p);
    p.onDidDispose(() => pages.delete(page.capture));
    p.webview.onDidReceiveMessage(async (m: { command?: string; file?: string; line?: number }) => {
      if (m.command !== "reveal" || typeof m.file !== "string") {
        return;
      }
      const line = Math.max(0, (m.line ?? 1) - 1);
      try {
        const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(m.file));
        const at = new vscode.Range(line, 0, line, 0);
        await vscode.window.showTextDocument(doc, { viewColumn: vscode.ViewColumn.One, selection: at });
      } catch {
        void vscode.window.showWarningMessage(
          `memlsp: ${m.file} is not in this workspace (set memlsp.pathMappings to map recorded paths).`,
        );
      }
    });
  }
  panel.title = page.title;
  panel.webview.html = page.html;
}

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
    vscode.commands.registerCommand("memlsp.showTimeline", showTimeline),
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
